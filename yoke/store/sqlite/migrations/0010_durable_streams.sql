-- The Durable Streams protocol (docs/durable-streams.md) on Yoke's streams;
-- see the PostgreSQL migration 0016 for the meaning of each column.
ALTER TABLE events ADD COLUMN data BLOB;

CREATE TABLE protocol_streams (
    tenant_id    TEXT    NOT NULL,
    sid          INTEGER NOT NULL,
    content_type TEXT    NOT NULL,
    ttl_s        INTEGER,
    expires_at   TEXT,
    expires_ms   INTEGER,
    touched_ms   INTEGER NOT NULL,
    fork_of      TEXT,
    fork_offset  INTEGER,
    fork_sub     INTEGER NOT NULL DEFAULT 0,
    stream_seq   TEXT,
    closed_by    TEXT,
    deleted      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, sid)
) WITHOUT ROWID;

CREATE TABLE protocol_producers (
    tenant_id   TEXT    NOT NULL,
    sid         INTEGER NOT NULL,
    producer_id TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid, producer_id)
) WITHOUT ROWID;
