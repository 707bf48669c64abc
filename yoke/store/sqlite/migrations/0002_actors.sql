-- Actors: instances, the fan-out cursor per stream, durable queues,
-- runtime workers, per-instance SQLite blobs, schedules and conversations.
-- The PostgreSQL schema (store/postgres/migrations/0002_actors.sql)
-- explains each table.
CREATE TABLE actor_instances (
    tenant_id   TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    config      TEXT    NOT NULL DEFAULT '{}',
    filter      TEXT,
    parent_id   TEXT,
    worker_id   TEXT,
    claimable_after INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, instance_id),
    UNIQUE (tenant_id, actor, key)
) WITHOUT ROWID;
CREATE INDEX actor_instances_worker ON actor_instances (tenant_id, worker_id);

CREATE TABLE routing_versions (
    tenant_id TEXT    PRIMARY KEY,
    version   INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE fanout_cursors (
    tenant_id TEXT    NOT NULL,
    sid       INTEGER NOT NULL,
    through   INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid)
) WITHOUT ROWID;

CREATE TABLE actor_queue (
    qid            INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id      TEXT    NOT NULL,
    instance_id    TEXT    NOT NULL,
    group_key      TEXT    NOT NULL DEFAULT '',
    priority       INTEGER NOT NULL DEFAULT 0,
    path           TEXT,
    seq            INTEGER,
    event          TEXT    NOT NULL,
    status         TEXT    NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'processing', 'dead')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    available_at   INTEGER NOT NULL,
    lease_until    INTEGER,
    worker_id      TEXT,
    enqueued_at    INTEGER NOT NULL,
    started_at     INTEGER,
    last_error     TEXT,
    last_traceback TEXT
);
CREATE INDEX actor_queue_claim
    ON actor_queue (tenant_id, instance_id, group_key, priority DESC, qid)
    WHERE status <> 'dead';
CREATE INDEX actor_queue_dead ON actor_queue (tenant_id, instance_id, qid) WHERE status = 'dead';
-- Live leases per (instance, group): the claim counts them.
CREATE INDEX actor_queue_leases
    ON actor_queue (tenant_id, instance_id, group_key, lease_until) WHERE status = 'processing';

CREATE TABLE runtime_workers (
    worker_id    TEXT    PRIMARY KEY,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    info         TEXT    NOT NULL DEFAULT '{}'
) WITHOUT ROWID;

CREATE TABLE actor_sqlite (
    tenant_id   TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    data        BLOB    NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, instance_id)
) WITHOUT ROWID;

CREATE TABLE actor_schedules (
    tenant_id   TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    due_at      INTEGER NOT NULL,
    cron        TEXT,
    event       TEXT    NOT NULL,
    stream      TEXT,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, instance_id, name)
) WITHOUT ROWID;
CREATE INDEX actor_schedules_due ON actor_schedules (tenant_id, due_at);

CREATE TABLE conversation_messages (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id       TEXT    NOT NULL,
    conversation_id TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    role            TEXT    NOT NULL,
    content         TEXT    NOT NULL,
    metadata        TEXT    NOT NULL DEFAULT '{}',
    at              INTEGER NOT NULL,
    event_seq       INTEGER,
    UNIQUE (tenant_id, message_id)
);
CREATE INDEX conversation_messages_by_id ON conversation_messages (tenant_id, conversation_id, seq);
