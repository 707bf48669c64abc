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
    -- After a change of hands, the new owner claims nothing before the
    -- previous owner's leases end (so two workers never run one instance).
    claimable_after bigint NOT NULL DEFAULT 0,
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
-- Live leases per (instance, group): the claim counts them.
CREATE INDEX actor_queue_leases
    ON actor_queue (tenant_id, instance_id, group_key, lease_until) WHERE status = 'processing';

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

-- Set the transaction's tenant for row-level security, refusing to switch
-- a transaction that already works for another tenant (as yoke_append does).
CREATE FUNCTION yoke_enter_tenant(p_tenant text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
END
$$;

GRANT EXECUTE ON FUNCTION yoke_enter_tenant TO yoke_runtime;

-- Complete finished rows and claim the next ones, in one round trip: delete
-- the rows given as (qid, attempts) of their claim (a late result of an
-- expired claim matches nothing), then, for each (instance, group) of the
-- instances p_worker owns in shard p_shard of p_shards that has rows, count its live leases and take its
-- first claimable rows (due pending rows, expired leases) in priority then
-- enqueue order, no more than its free slots, from the claim index; lock
-- them skipping rows another claimer holds, and mark them processing.
CREATE FUNCTION yoke_claim(
    p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[],
    p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[],
    p_shard integer, p_shards integer
) RETURNS TABLE (
    o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text,
    o_seq bigint, o_event jsonb, o_status text, o_attempts integer, o_available_at bigint,
    o_lease_until bigint, o_worker text, o_enqueued_at bigint, o_started_at bigint,
    o_error text, o_traceback text, o_actor text
)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    -- Losing this transaction in a server crash is harmless: a lost claim
    -- leaves its rows pending, a lost delete runs a row again (at least
    -- once). And any later durable commit (a process() side effect) flushes
    -- the WAL this transaction wrote first. So it does not wait for fsync.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF cardinality(p_done) > 0 THEN
        -- Found by primary key (qid = ANY), then fenced by the claim's attempts.
        DELETE FROM actor_queue q
        WHERE q.tenant_id = p_tenant AND q.qid = ANY(p_done) AND q.status = 'processing'
          AND q.attempts = (SELECT d.attempts FROM unnest(p_done, p_done_attempts) AS d(qid, attempts)
                            WHERE d.qid = q.qid LIMIT 1);
    END IF;
    IF p_limit <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH pol AS (
        SELECT * FROM unnest(p_actors, p_conc, p_lease) AS p(actor, concurrency, lease_ms)
    ), groups AS (
        -- The distinct groups of each owned instance, by skipping through the
        -- claim index (one probe per group), not by reading every queued row.
        SELECT i.instance_id, i.actor, p.concurrency, p.lease_ms, g.group_key
        FROM actor_instances i
        JOIN pol p ON p.actor = i.actor
        CROSS JOIN LATERAL (
            WITH RECURSIVE r(k) AS (
                (SELECT q.group_key FROM actor_queue q
                 WHERE q.tenant_id = p_tenant AND q.instance_id = i.instance_id AND q.status <> 'dead'
                 ORDER BY q.group_key LIMIT 1)
                UNION ALL
                SELECT (SELECT q.group_key FROM actor_queue q
                        WHERE q.tenant_id = p_tenant AND q.instance_id = i.instance_id
                          AND q.status <> 'dead' AND q.group_key > r.k
                        ORDER BY q.group_key LIMIT 1)
                FROM r WHERE r.k IS NOT NULL
            )
            SELECT k AS group_key FROM r WHERE k IS NOT NULL
        ) g
        WHERE i.tenant_id = p_tenant AND i.worker_id = p_worker
          AND (p_shards <= 1 OR mod(hashtext(i.instance_id) & 2147483647, p_shards) = p_shard)
          -- An instance that just changed hands waits until its previous
          -- owner's leases end: two workers never run one instance (each
          -- has its own copy of the instance's database).
          AND i.claimable_after <= p_now
    ), picked AS (
        SELECT c.qid, c.priority, g.lease_ms, g.actor
        FROM groups g
        CROSS JOIN LATERAL (
            SELECT g.concurrency - count(*) AS free FROM actor_queue b
            WHERE b.tenant_id = p_tenant AND b.instance_id = g.instance_id AND b.group_key = g.group_key
              AND b.status = 'processing' AND b.lease_until > p_now
        ) busy
        CROSS JOIN LATERAL (
            SELECT q.qid, q.priority FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.instance_id = g.instance_id AND q.group_key = g.group_key
              AND q.status <> 'dead'
              AND ((q.status = 'pending' AND q.available_at <= p_now)
                   OR (q.status = 'processing' AND q.lease_until <= p_now))
            ORDER BY q.priority DESC, q.qid
            LIMIT greatest(busy.free, 0)
        ) c
        ORDER BY c.priority DESC, c.qid
        LIMIT p_limit
    ), locked AS (
        -- The claimable condition again: rechecked on the latest row version
        -- should a competing claim have committed since this statement began.
        SELECT q.qid FROM actor_queue q
        WHERE q.tenant_id = p_tenant AND q.qid = ANY(ARRAY(SELECT qid FROM picked))
          AND ((q.status = 'pending' AND q.available_at <= p_now)
               OR (q.status = 'processing' AND q.lease_until <= p_now))
        FOR UPDATE SKIP LOCKED
    )
    UPDATE actor_queue q
    SET status = 'processing', attempts = q.attempts + 1, lease_until = p_now + p.lease_ms,
        worker_id = p_worker, started_at = p_now
    FROM picked p
    WHERE q.tenant_id = p_tenant AND q.qid = ANY(ARRAY(SELECT qid FROM locked)) AND p.qid = q.qid
    RETURNING q.qid, q.tenant_id, q.instance_id, q.group_key, q.priority, q.path, q.seq, q.event, q.status, q.attempts,
            q.available_at, q.lease_until, q.worker_id, q.enqueued_at, q.started_at, q.last_error,
            q.last_traceback, p.actor;
END
$$;

GRANT EXECUTE ON FUNCTION yoke_claim TO yoke_runtime;

-- Fan-out of one page of a stream, in one round trip: unless the stream's
-- cursor moved from p_expected ('moved': another process routed these
-- events) or the routing version changed ('stale': instances appeared since
-- the caller built its index), create the keyed instances the page names
-- (one per (actor, key), whatever the concurrency; p_new_id proposes ids),
-- enqueue every item in order, and move the cursor to p_through. Items with
-- a NULL p_instance go to the instance of (p_actor, p_key).
CREATE FUNCTION yoke_fanout(
    p_tenant text, p_path text, p_expected bigint, p_through bigint, p_version bigint,
    p_worker text, p_now bigint,
    p_instance text[], p_actor text[], p_key text[], p_new_id text[],
    p_group text[], p_priority integer[], p_seq bigint[], p_event text[]
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_sid bigint;
    v_through bigint;
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    -- Enqueueing and the cursor move are lost or kept together, and redone
    -- from the cursor if lost: no need to wait for fsync (any later durable
    -- commit flushes this one's WAL first).
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT sid INTO v_sid FROM streams WHERE tenant_id = p_tenant AND path = p_path;
    IF NOT FOUND THEN
        RETURN 'moved';
    END IF;
    INSERT INTO fanout_cursors VALUES (p_tenant, v_sid, 0) ON CONFLICT DO NOTHING;
    SELECT through INTO v_through FROM fanout_cursors
        WHERE tenant_id = p_tenant AND sid = v_sid FOR UPDATE;
    IF v_through <> p_expected THEN
        RETURN 'moved';
    END IF;
    IF coalesce((SELECT version FROM routing_versions WHERE tenant_id = p_tenant), 0) <> p_version THEN
        RETURN 'stale';
    END IF;
    IF cardinality(p_event) > 0 THEN
        INSERT INTO actor_instances (tenant_id, instance_id, actor, key, worker_id, created_at)
        SELECT DISTINCT ON (t.actor, t.key) p_tenant, t.new_id, t.actor, t.key, p_worker, p_now
        FROM unnest(p_instance, p_actor, p_key, p_new_id) AS t(instance, actor, key, new_id)
        WHERE t.instance IS NULL
        ON CONFLICT (tenant_id, actor, key) DO NOTHING;
        INSERT INTO actor_queue (tenant_id, instance_id, group_key, priority, path, seq, event,
                                 available_at, enqueued_at)
        SELECT p_tenant, coalesce(t.instance, i.instance_id), coalesce(t.grp, ''), t.priority,
               p_path, t.seq, t.event::jsonb, p_now, p_now
        FROM unnest(p_instance, p_actor, p_key, p_group, p_priority, p_seq, p_event)
             WITH ORDINALITY AS t(instance, actor, key, grp, priority, seq, event, ord)
        LEFT JOIN actor_instances i
               ON t.instance IS NULL AND i.tenant_id = p_tenant AND i.actor = t.actor AND i.key = t.key
        ORDER BY t.ord;
        PERFORM pg_notify('yoke_queue', p_tenant);
    END IF;
    UPDATE fanout_cursors SET through = p_through WHERE tenant_id = p_tenant AND sid = v_sid;
    RETURN 'ok';
END
$$;

GRANT EXECUTE ON FUNCTION yoke_fanout TO yoke_runtime;
