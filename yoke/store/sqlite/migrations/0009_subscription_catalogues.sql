-- The subscription catalogue's own record, per source stream: the lifetime
-- and reducer version its rows were reduced by, how many rows it holds, and
-- an unfinished rebuild's stage. The PostgreSQL schema
-- (store/postgres/migrations/0015_subscription_catalogues.sql) explains it.
CREATE TABLE subscription_catalogues (
    tenant_id     TEXT    NOT NULL,
    path          TEXT    NOT NULL,
    stream_id     TEXT    NOT NULL,
    reducer       TEXT    NOT NULL,
    subscriptions INTEGER NOT NULL DEFAULT 0,
    stage         TEXT,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, path)
) WITHOUT ROWID;
