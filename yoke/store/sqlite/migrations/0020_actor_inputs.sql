-- An instance's inputs, kept (yoke/store/inputs.py, docs/advanced/forks.md).
-- The PostgreSQL schema (store/postgres/migrations/0033_actor_inputs.sql)
-- explains each column.
CREATE TABLE actor_inputs (
    input_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id    TEXT    NOT NULL,
    instance_id  TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    qid          INTEGER NOT NULL,
    path         TEXT,
    stream_seq   INTEGER,
    event        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    outcome      TEXT    NOT NULL CHECK (outcome IN ('done', 'dead')),
    enqueued_at  INTEGER NOT NULL,
    started_at   INTEGER,
    processed_at INTEGER NOT NULL,
    code_version TEXT,
    tape         TEXT,
    last_error   TEXT
);
CREATE INDEX actor_inputs_instance ON actor_inputs (tenant_id, instance_id, seq);
CREATE INDEX actor_inputs_age ON actor_inputs (tenant_id, processed_at);
