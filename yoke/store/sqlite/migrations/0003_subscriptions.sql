-- Subscriptions, the receiver's passive fence and processor checkpoints.
-- The PostgreSQL schema (store/postgres/migrations/0003_subscriptions.sql)
-- explains each table and column.
CREATE TABLE subscriptions (
    tenant_id        TEXT    NOT NULL,
    path             TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    config           TEXT    NOT NULL,
    configured_at    INTEGER NOT NULL,
    configured_id    TEXT    NOT NULL,
    configured_ms    INTEGER NOT NULL,
    generation       INTEGER NOT NULL,
    source_stream_id TEXT    NOT NULL,
    halted           TEXT,
    gave_up          TEXT,
    processed_through_offset INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    skips            INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    next_retry_at    INTEGER NOT NULL DEFAULT 0,
    delivered        INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    secret           TEXT,
    lease_owner      TEXT,
    lease_until      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, path, name)
) WITHOUT ROWID;
CREATE INDEX subscriptions_receiver ON subscriptions (tenant_id, json_extract(config, '$.target'));

CREATE TABLE subscription_inbound (
    tenant_id         TEXT    NOT NULL,
    path              TEXT    NOT NULL,
    source_path       TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    source_stream_id  TEXT    NOT NULL,
    source_created_at INTEGER NOT NULL,
    generation        INTEGER NOT NULL,
    received          INTEGER NOT NULL DEFAULT 0,
    last_received_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, path, source_path, name)
) WITHOUT ROWID;

CREATE TABLE processor_checkpoints (
    tenant_id  TEXT    NOT NULL,
    path       TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    version    TEXT    NOT NULL,
    stream_id  TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    through    INTEGER NOT NULL,
    state      TEXT    NOT NULL,
    complete   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, path, name)
) WITHOUT ROWID;
