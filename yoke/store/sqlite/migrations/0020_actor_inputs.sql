-- An instance's inputs, kept, and forks of instances (yoke/store/inputs.py,
-- yoke/store/forks.py, docs/advanced/forks.md). The PostgreSQL schema
-- (store/postgres/migrations/0033_actor_inputs.sql) explains each column.
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
CREATE UNIQUE INDEX actor_inputs_instance ON actor_inputs (tenant_id, instance_id, seq);
CREATE INDEX actor_inputs_age ON actor_inputs (tenant_id, processed_at);

CREATE TABLE actor_forks (
    tenant_id   TEXT    NOT NULL,
    fork_id     TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    upto        INTEGER,
    app         TEXT,
    edits       TEXT    NOT NULL,
    summary     TEXT    NOT NULL,
    report      TEXT    NOT NULL,
    image       BLOB    NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, fork_id)
) WITHOUT ROWID;
CREATE INDEX actor_forks_instance ON actor_forks (tenant_id, instance_id, fork_id);
CREATE INDEX actor_forks_expiry ON actor_forks (expires_at);

ALTER TABLE actor_instances ADD COLUMN inputs_incomplete INTEGER NOT NULL DEFAULT 0;
UPDATE actor_instances SET inputs_incomplete = 1;
