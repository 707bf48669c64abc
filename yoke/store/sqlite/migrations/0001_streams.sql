-- Streams and their events. Every key starts with tenant_id.
CREATE TABLE streams (
    tenant_id      TEXT    NOT NULL,
    path           TEXT    NOT NULL,
    sid            INTEGER NOT NULL UNIQUE,   -- internal key used by events
    stream_id      TEXT    NOT NULL,          -- random lifetime id, public
    created_at     INTEGER NOT NULL,          -- ms since epoch
    head           INTEGER NOT NULL DEFAULT 0,  -- highest offset ever assigned
    pruned_through INTEGER NOT NULL DEFAULT 0,  -- retention removed offsets <= this
    closed         INTEGER NOT NULL DEFAULT 0,
    legal_hold     INTEGER NOT NULL DEFAULT 0,
    max_age_s      REAL,
    max_events     INTEGER,
    PRIMARY KEY (tenant_id, path)
) WITHOUT ROWID;

CREATE TABLE events (
    tenant_id       TEXT    NOT NULL,
    sid             INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    id              TEXT    NOT NULL,
    at              INTEGER NOT NULL,
    type            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    metadata        TEXT    NOT NULL,
    source          TEXT,
    correlation     TEXT,
    priority        INTEGER NOT NULL DEFAULT 0,
    group_id        TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,              -- set when there is an idempotency_key
    size            INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX events_idempotency
    ON events (tenant_id, sid, idempotency_key) WHERE idempotency_key IS NOT NULL;
