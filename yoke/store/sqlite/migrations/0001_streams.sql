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
    -- Producer credit, kept exact in the transactions that insert, ack and
    -- prune (see the PostgreSQL schema for the meaning of each column).
    durable_events INTEGER NOT NULL DEFAULT 0,
    durable_bytes  INTEGER NOT NULL DEFAULT 0,
    min_ack        INTEGER,
    unread_events  INTEGER NOT NULL DEFAULT 0,
    unread_bytes   INTEGER NOT NULL DEFAULT 0,
    max_unread_events INTEGER,
    max_unread_bytes  INTEGER,
    max_total_events  INTEGER,
    max_total_bytes   INTEGER,
    overflow       TEXT    NOT NULL DEFAULT 'reject' CHECK (overflow IN ('reject', 'block')),
    block_timeout_s REAL   NOT NULL DEFAULT 5,
    pinned         INTEGER NOT NULL DEFAULT 0,
    metadata       TEXT    NOT NULL DEFAULT '{}',
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

CREATE TABLE consumers (
    tenant_id   TEXT    NOT NULL,
    sid         INTEGER NOT NULL,
    consumer_id TEXT    NOT NULL,
    acked       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid, consumer_id)
) WITHOUT ROWID;

-- Object bytes live in files under <data dir>/objects/; this is their metadata.
CREATE TABLE objects (
    tenant_id       TEXT    NOT NULL,
    sid             INTEGER NOT NULL,
    object_id       TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    sha256          TEXT    NOT NULL,
    size            INTEGER NOT NULL,
    content_type    TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('prepared', 'uploaded', 'committed', 'aborted')),
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    committed_seq   INTEGER,
    PRIMARY KEY (tenant_id, sid, object_id),
    UNIQUE (tenant_id, sid, idempotency_key)
) WITHOUT ROWID;

CREATE TABLE tokens (
    tenant_id   TEXT    NOT NULL,
    token_id    TEXT    NOT NULL UNIQUE,
    name        TEXT    NOT NULL,
    scopes      TEXT    NOT NULL,  -- comma-separated
    secret_hash TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER,
    PRIMARY KEY (tenant_id, token_id)
) WITHOUT ROWID;
