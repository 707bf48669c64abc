-- Input records and their delivery outbox commit together (seed 004;
-- yoke/streams/inputs.py): one row per input record, deleted once the
-- record's wake event is published.
CREATE TABLE input_outbox (
    tenant_id  TEXT    NOT NULL,
    sid        INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    record_id  TEXT    NOT NULL,
    wake_path  TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_at    INTEGER NOT NULL,
    error      TEXT,
    PRIMARY KEY (tenant_id, sid, seq)
);
CREATE INDEX input_outbox_due ON input_outbox (tenant_id, next_at);
