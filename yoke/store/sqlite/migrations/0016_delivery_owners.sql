-- Delivering processes: a process holds the subscriptions whose lease_owner
-- it is while its row lives (see the PostgreSQL migration 0025_delivery_owners.sql).
CREATE TABLE delivery_owners (
    owner        TEXT    PRIMARY KEY,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    lease_ms     INTEGER NOT NULL,
    info         TEXT    NOT NULL DEFAULT '{}'
) WITHOUT ROWID;
