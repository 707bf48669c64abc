-- Hardening of values, object records and tails (issue 10), in one pass
-- over the functions that 0001, 0002 and 0004 defined.
--
-- 1. Values come back exactly as they were appended. jsonb normalizes
-- numbers: the float 1e18 came back as the integer 1000000000000000000,
-- 1E+2 as 100 and -0.0 as 0.0, on reads and in the events actors receive.
-- The json type keeps the text as written (Yoke writes canonical JSON:
-- sorted keys, no whitespace, shortest round-trip floats), so every column
-- that holds a caller's document becomes json: event payload, metadata and
-- source, stream metadata, instance config, queued and scheduled events,
-- conversation messages, processor state. Yoke's own documents (instance
-- filters, subscription configuration and halts, worker info) stay jsonb:
-- SQL looks inside them. yoke_append, yoke_read, yoke_claim and yoke_fanout
-- are recreated with json in place of jsonb.
--
-- 2. An object record binds its object, not its key (yoke_append step 2
-- and the guard on the binding UPDATE in step 4). A record's duplicate key
-- used to be enough for success: a record holding an object's key
-- (object:<id>) that had not committed the object made a later commit
-- answer with that record's offset while the object stayed uploaded, to
-- expire and be removed under a live record. Now a duplicate of an object
-- record counts only when the object was committed by that very record
-- (state committed, committed_seq = its offset), anything else refuses the
-- batch ('object'); a new object record is refused once the object has
-- expired (expiry is terminal, a legal hold only stops the cleanup from
-- deleting it); and the object rows are locked (FOR UPDATE) while the
-- record is appended, so an abort or a cleanup running meanwhile waits and
-- then sees the committed state.
--
-- 3. yoke_read also returns the stream row's closed flag, read in the same
-- statement as head and the events: a tail of a closed stream ends once it
-- has delivered everything up to the head, and taking closed and head from
-- the one row version the events were read against means a tail can never
-- end before an event that was committed ahead of the close.

ALTER TABLE streams ALTER COLUMN metadata DROP DEFAULT;
ALTER TABLE streams ALTER COLUMN metadata TYPE json USING metadata::json;
ALTER TABLE streams ALTER COLUMN metadata SET DEFAULT '{}';
ALTER TABLE events
    ALTER COLUMN payload TYPE json USING payload::json,
    ALTER COLUMN metadata TYPE json USING metadata::json,
    ALTER COLUMN source TYPE json USING source::json;
ALTER TABLE actor_instances ALTER COLUMN config DROP DEFAULT;
ALTER TABLE actor_instances ALTER COLUMN config TYPE json USING config::json;
ALTER TABLE actor_instances ALTER COLUMN config SET DEFAULT '{}';
ALTER TABLE actor_queue ALTER COLUMN event TYPE json USING event::json;
ALTER TABLE actor_schedules ALTER COLUMN event TYPE json USING event::json;
ALTER TABLE conversation_messages ALTER COLUMN metadata DROP DEFAULT;
ALTER TABLE conversation_messages
    ALTER COLUMN content TYPE json USING content::json,
    ALTER COLUMN metadata TYPE json USING metadata::json;
ALTER TABLE conversation_messages ALTER COLUMN metadata SET DEFAULT '{}';
ALTER TABLE processor_checkpoints ALTER COLUMN state TYPE json USING state::json;

DROP FUNCTION yoke_append(text, text, text, bigint, integer[], text[], text[], text[], text[],
    text[], text[], integer[], text[], text[], text[], integer[], boolean[], text[], boolean);

CREATE FUNCTION yoke_append(
    p_tenant text, p_path text, p_stream_id text, p_now bigint,
    p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[],
    p_source text[], p_correlation text[], p_priority integer[], p_group text[],
    p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[],
    p_kernel boolean DEFAULT false
) RETURNS TABLE (o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s streams%ROWTYPE;
    n integer := cardinality(p_id);
    v_status text[];          -- per event: new | duplicate
    v_seq bigint[];           -- per event: the original offset of a duplicate
    v_eid text[];
    v_at bigint[];
    v_batch text[];           -- per batch (index b + 1): NULL = admitted, else why not
    v_refused text;           -- once a batch lacks credit, later batches wait too
    v_admitted integer[];     -- input positions of the new, admitted events
    v_new integer := 0;       -- offsets taken
    v_events bigint := 0;     -- durable rows written
    v_bytes bigint := 0;
    r record;
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    SELECT * INTO s FROM streams WHERE tenant_id = p_tenant AND path = p_path FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO yoke_tenants VALUES (p_tenant, p_now) ON CONFLICT DO NOTHING;
        INSERT INTO streams (tenant_id, path, stream_id, created_at)
            VALUES (p_tenant, p_path, p_stream_id, p_now) ON CONFLICT DO NOTHING;
        SELECT * INTO s FROM streams WHERE tenant_id = p_tenant AND path = p_path FOR UPDATE;
    END IF;
    IF (p_kernel OR (NOT s.closed AND s.max_unread_events IS NULL AND s.max_unread_bytes IS NULL
                     AND s.max_total_events IS NULL AND s.max_total_bytes IS NULL))
       AND NOT EXISTS (SELECT 1 FROM unnest(p_key, p_object) k(key, obj)
                       WHERE k.key IS NOT NULL OR k.obj IS NOT NULL) THEN
        -- Fast path: every event is new and admitted.
        INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                            correlation, priority, group_id, idempotency_key, fingerprint, size)
        SELECT p_tenant, s.sid, s.head + t.ord, t.id, p_now, t.type, t.payload::json,
               t.metadata::json, t.source::json, t.correlation, t.priority, t.group_id,
               NULL, NULL, t.size
        FROM unnest(p_id, p_type, p_payload, p_metadata, p_source, p_correlation, p_priority,
                    p_group, p_size, p_eph)
             WITH ORDINALITY AS t(id, type, payload, metadata, source, correlation, priority,
                                  group_id, size, eph, ord)
        WHERE NOT t.eph;
        SELECT count(*), coalesce(sum(t.size), 0) INTO v_events, v_bytes
            FROM unnest(p_size, p_eph) t(size, eph) WHERE NOT t.eph;
        UPDATE streams SET head = s.head + n,
               durable_events = durable_events + v_events,
               durable_bytes = durable_bytes + v_bytes,
               unread_events = unread_events + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_events END,
               unread_bytes = unread_bytes + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_bytes END
            WHERE tenant_id = p_tenant AND sid = s.sid;
        PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
        -- Offsets are head + 1 .. head + n in input order: one row says it all.
        RETURN QUERY SELECT 'ok'::text, s.head + 1, NULL::text, p_now, s.head + n;
        RETURN;
    END IF;

    v_status := array_fill('new'::text, ARRAY[n]);
    v_seq := array_fill(NULL::bigint, ARRAY[n]);
    v_eid := p_id;
    v_at := array_fill(p_now, ARRAY[n]);
    v_batch := array_fill(NULL::text, ARRAY[coalesce((SELECT max(b) FROM unnest(p_batch) b), 0) + 1]);

    -- 1. Idempotency keys, under the stream row lock.
    FOR r IN
        SELECT t.ord, t.b, e.seq, e.id, e.at, e.fingerprint = t.fp AS same
        FROM unnest(p_key, p_fp, p_batch) WITH ORDINALITY AS t(key, fp, b, ord)
        CROSS JOIN LATERAL (
            SELECT seq, id, at, fingerprint FROM events
            WHERE tenant_id = p_tenant AND idempotency_key = t.key AND sid + 0 = s.sid LIMIT 1
        ) e
    LOOP
        IF r.same THEN
            v_status[r.ord] := 'duplicate';
            v_seq[r.ord] := r.seq;
            v_eid[r.ord] := r.id;
            v_at[r.ord] := r.at;
        ELSE
            v_batch[r.b + 1] := 'conflict';
        END IF;
    END LOOP;

    -- 2. Object bindings, each object row locked until the commit (an abort
    -- or a cleanup waits): a new record may only reference an uploaded
    -- object that has not expired; a duplicate counts only when its object
    -- was committed by the record the key found.
    FOR r IN
        SELECT t.ord, t.b, o.state, o.expires_at, o.committed_seq
        FROM unnest(p_object, p_batch) WITH ORDINALITY AS t(obj, b, ord)
        LEFT JOIN LATERAL (
            SELECT state, expires_at, committed_seq FROM objects
            WHERE tenant_id = p_tenant AND sid = s.sid AND object_id = t.obj
            FOR UPDATE
        ) o ON true
        WHERE t.obj IS NOT NULL
    LOOP
        IF (v_status[r.ord] = 'duplicate'
            AND (r.state IS DISTINCT FROM 'committed' OR r.committed_seq IS DISTINCT FROM v_seq[r.ord]))
           OR (v_status[r.ord] = 'new'
               AND (r.state IS DISTINCT FROM 'uploaded' OR r.expires_at < p_now)) THEN
            v_batch[r.b + 1] := coalesce(v_batch[r.b + 1], 'object');
        END IF;
    END LOOP;

    -- 3. Producer credit, batch by batch, from the durable counters.
    FOR r IN
        SELECT t.b,
               count(*) FILTER (WHERE v_status[t.ord] = 'new') AS fresh,
               count(*) FILTER (WHERE NOT t.eph AND v_status[t.ord] = 'new') AS events,
               coalesce(sum(t.size) FILTER (WHERE NOT t.eph AND v_status[t.ord] = 'new'), 0) AS bytes
        FROM unnest(p_batch, p_size, p_eph) WITH ORDINALITY AS t(b, size, eph, ord)
        GROUP BY t.b ORDER BY t.b
    LOOP
        CONTINUE WHEN v_batch[r.b + 1] IS NOT NULL;
        IF s.closed AND r.fresh > 0 AND NOT p_kernel THEN
            v_batch[r.b + 1] := 'closed';
            CONTINUE;
        END IF;
        IF v_refused IS NULL AND r.events > 0 AND NOT p_kernel THEN
            IF s.durable_events + v_events + r.events > s.max_total_events
               OR s.durable_bytes + v_bytes + r.bytes > s.max_total_bytes THEN
                v_refused := 'quota';
            ELSIF s.min_ack IS NOT NULL AND (
                  s.unread_events + v_events + r.events > s.max_unread_events
                  OR s.unread_bytes + v_bytes + r.bytes > s.max_unread_bytes) THEN
                v_refused := 'unread_full';
            END IF;
        END IF;
        IF v_refused IS NOT NULL THEN
            v_batch[r.b + 1] := v_refused;
        ELSE
            v_events := v_events + r.events;
            v_bytes := v_bytes + r.bytes;
        END IF;
    END LOOP;

    -- 4. The admitted new events, in order, take offsets head + 1, head + 2, ...
    SELECT coalesce(array_agg(t.ord ORDER BY t.ord), '{}') INTO v_admitted
    FROM unnest(p_batch) WITH ORDINALITY AS t(b, ord)
    WHERE v_batch[t.b + 1] IS NULL AND v_status[t.ord] = 'new';
    v_new := cardinality(v_admitted);

    INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                        correlation, priority, group_id, idempotency_key, fingerprint, size)
    SELECT p_tenant, s.sid, s.head + a.i, p_id[a.ord], p_now, p_type[a.ord],
           p_payload[a.ord]::json, p_metadata[a.ord]::json, p_source[a.ord]::json,
           p_correlation[a.ord], p_priority[a.ord], p_group[a.ord], p_key[a.ord], p_fp[a.ord],
           p_size[a.ord]
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i) WHERE NOT p_eph[a.ord];

    UPDATE objects o SET state = 'committed', committed_seq = s.head + a.i
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i)
    WHERE p_object[a.ord] IS NOT NULL
      AND o.tenant_id = p_tenant AND o.sid = s.sid AND o.object_id = p_object[a.ord]
      AND o.state = 'uploaded';

    UPDATE streams SET head = s.head + v_new,
           durable_events = durable_events + v_events,
           durable_bytes = durable_bytes + v_bytes,
           unread_events = unread_events + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_events END,
           unread_bytes = unread_bytes + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_bytes END
        WHERE tenant_id = p_tenant AND sid = s.sid;
    IF v_new > 0 THEN
        PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
    END IF;

    RETURN QUERY
    SELECT CASE WHEN v_batch[t.b + 1] IS NOT NULL THEN v_batch[t.b + 1]
                WHEN v_status[t.ord] = 'duplicate' THEN 'duplicate'
                ELSE 'ok' END,
           CASE WHEN v_batch[t.b + 1] IS NOT NULL THEN NULL
                ELSE coalesce(s.head + a.i, v_seq[t.ord]) END,
           v_eid[t.ord], v_at[t.ord], s.head + v_new
    FROM unnest(p_batch) WITH ORDINALITY AS t(b, ord)
    LEFT JOIN unnest(v_admitted) WITH ORDINALITY AS a(ord, i) ON a.ord = t.ord
    ORDER BY t.ord;
END
$$;

GRANT EXECUTE ON FUNCTION yoke_append TO yoke_runtime;

DROP FUNCTION yoke_read(text, text, bigint, bigint, integer);

CREATE FUNCTION yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint,
                          p_limit integer)
RETURNS TABLE (head bigint, pruned_through bigint, closed boolean, seq bigint, id text, at bigint,
               type text, payload json, metadata json, source json, correlation text,
               priority integer, group_id text, idempotency_key text)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, s.closed, e.seq, e.id, e.at, e.type, e.payload, e.metadata,
           e.source, e.correlation, e.priority, e.group_id, e.idempotency_key
    FROM streams s
    LEFT JOIN LATERAL (
        SELECT ev.* FROM events ev
        WHERE ev.tenant_id = s.tenant_id AND ev.sid = s.sid
          AND ev.seq > p_after AND ev.seq <= p_upto
        ORDER BY ev.seq LIMIT p_limit
    ) e ON true
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$$;

GRANT EXECUTE ON FUNCTION yoke_read TO yoke_runtime;

DROP FUNCTION yoke_claim(text, text, text[], integer[], bigint[], bigint, integer, bigint[],
    integer[], integer, integer);

CREATE FUNCTION yoke_claim(
    p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[],
    p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[],
    p_shard integer, p_shards integer
) RETURNS TABLE (
    o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text,
    o_seq bigint, o_event json, o_status text, o_attempts integer, o_available_at bigint,
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

DROP FUNCTION yoke_fanout(text, text, bigint, bigint, bigint, text, bigint, text[], text[],
    text[], text[], text[], integer[], bigint[], text[]);

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
               p_path, t.seq, t.event::json, p_now, p_now
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
