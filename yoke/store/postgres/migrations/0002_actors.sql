-- Actors: instances, the fan-out cursor per stream, durable queues,
-- runtime workers, per-instance SQLite blobs, schedules and conversations.

-- One row per actor instance; (actor, key) is unique per tenant, so keyed
-- routing can never create two instances for one key.
CREATE TABLE actor_instances (
    tenant_id   text   NOT NULL,
    instance_id text   NOT NULL,
    actor       text   NOT NULL,
    key         text   NOT NULL,
    config      jsonb  NOT NULL DEFAULT '{}',
    filter      jsonb,            -- NULL: routed by the actor's key (keyed, singleton)
    parent_id   text,
    worker_id   text,             -- the runtime worker that executes it (NULL: unowned)
    created_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, instance_id),
    UNIQUE (tenant_id, actor, key)
);
CREATE INDEX actor_instances_worker ON actor_instances (tenant_id, worker_id);

-- Bumped whenever an instance with its own filter appears: a fan-out pass
-- that matched with an older index is refused and redone.
CREATE TABLE routing_versions (
    tenant_id text   PRIMARY KEY,
    version   bigint NOT NULL
);

-- How far fan-out has routed each stream. Enqueueing and moving the
-- cursor happen in one transaction that first checks the cursor, so an
-- event is enqueued at most once per instance whatever the retries.
CREATE TABLE fanout_cursors (
    tenant_id text   NOT NULL,
    sid       bigint NOT NULL,
    through   bigint NOT NULL,
    PRIMARY KEY (tenant_id, sid)
);

CREATE TABLE actor_queue (
    tenant_id      text    NOT NULL,
    qid            bigint  GENERATED ALWAYS AS IDENTITY,
    instance_id    text    NOT NULL,
    group_key      text    NOT NULL DEFAULT '',   -- the event's group_id, '' for none
    priority       integer NOT NULL DEFAULT 0,
    path           text,                           -- origin stream (NULL: sent directly)
    seq            bigint,
    event          jsonb   NOT NULL,
    status         text    NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'processing', 'dead')),
    attempts       integer NOT NULL DEFAULT 0,     -- claims so far; fences late results
    available_at   bigint  NOT NULL,
    lease_until    bigint,
    worker_id      text,
    enqueued_at    bigint  NOT NULL,
    started_at     bigint,
    last_error     text,
    last_traceback text,
    PRIMARY KEY (tenant_id, qid)
);
CREATE INDEX actor_queue_claim
    ON actor_queue (tenant_id, instance_id, group_key, priority DESC, qid)
    WHERE status <> 'dead';
CREATE INDEX actor_queue_dead ON actor_queue (tenant_id, instance_id, qid) WHERE status = 'dead';

-- Worker processes sharing this database (no tenant: a worker serves all).
CREATE TABLE runtime_workers (
    worker_id    text   PRIMARY KEY,
    started_at   bigint NOT NULL,
    heartbeat_at bigint NOT NULL,
    info         jsonb  NOT NULL DEFAULT '{}'
);

-- YOKE_STORAGE=pg_sqlite: each instance's SQLite database, serialized.
CREATE TABLE actor_sqlite (
    tenant_id   text   NOT NULL,
    instance_id text   NOT NULL,
    data        bytea  NOT NULL,
    updated_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, instance_id)
);

CREATE TABLE actor_schedules (
    tenant_id   text   NOT NULL,
    instance_id text   NOT NULL,
    name        text   NOT NULL,
    due_at      bigint NOT NULL,
    cron        text,
    event       jsonb  NOT NULL,
    stream      text,              -- append here instead of enqueueing to the instance
    created_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, instance_id, name)
);
CREATE INDEX actor_schedules_due ON actor_schedules (tenant_id, due_at);

-- Conversation messages are canonical here; the stream carries ids only.
CREATE TABLE conversation_messages (
    tenant_id       text   NOT NULL,
    conversation_id text   NOT NULL,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    message_id      text   NOT NULL,
    role            text   NOT NULL,
    content         jsonb  NOT NULL,
    metadata        jsonb  NOT NULL DEFAULT '{}',
    at              bigint NOT NULL,
    event_seq       bigint,
    PRIMARY KEY (tenant_id, conversation_id, seq),
    UNIQUE (tenant_id, message_id)
);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['actor_instances', 'routing_versions', 'fanout_cursors',
                             'actor_queue', 'actor_sqlite', 'actor_schedules',
                             'conversation_messages'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I'
            ' USING (tenant_id = current_setting(''yoke.tenant'', true))'
            ' WITH CHECK (tenant_id = current_setting(''yoke.tenant'', true))', t);
    END LOOP;
END
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON actor_instances, routing_versions, fanout_cursors,
    actor_queue, actor_sqlite, actor_schedules, conversation_messages, runtime_workers
    TO yoke_runtime;
