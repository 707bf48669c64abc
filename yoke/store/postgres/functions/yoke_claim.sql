-- yoke_claim: the current definition, as the migrations leave it (the last
-- to define it is migrations/0029_claim_queued_groups.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_claim(p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[], p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[], p_shard integer, p_shards integer)
 RETURNS TABLE(o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text, o_seq bigint, o_event json, o_status text, o_attempts integer, o_available_at bigint, o_lease_until bigint, o_worker text, o_enqueued_at bigint, o_started_at bigint, o_error text, o_traceback text, o_actor text)
 LANGUAGE plpgsql
AS $function$
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
    -- Shared with this worker's other claims, exclusive with its release of
    -- instances (release_excess): a release waits for the claims under
    -- way to commit and sees the rows they took; a claim after it sees the
    -- instance gone.
    PERFORM pg_advisory_xact_lock_shared(24065, hashtext(p_worker));
    RETURN QUERY
    WITH pol AS (
        SELECT * FROM unnest(p_actors, p_conc, p_lease) AS p(actor, concurrency, lease_ms)
    ), queued(instance_id, group_key) AS (
        -- The queued (instance, group)s, by skipping through the claim index
        -- (one probe per group, not a read of every queued row), and not by
        -- visiting every instance this worker owns: with thousands of keyed
        -- instances, most have nothing queued.
        WITH RECURSIVE r(instance_id, group_key) AS (
            (SELECT q.instance_id, q.group_key FROM actor_queue q
             WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
             ORDER BY q.instance_id, q.group_key LIMIT 1)
            UNION ALL
            SELECT n.instance_id, n.group_key FROM r
            CROSS JOIN LATERAL (
                SELECT q.instance_id, q.group_key FROM actor_queue q
                WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
                  AND (q.instance_id, q.group_key) > (r.instance_id, r.group_key)
                ORDER BY q.instance_id, q.group_key LIMIT 1
            ) n
        )
        SELECT * FROM r
    ), groups AS (
        SELECT i.instance_id, i.actor, p.concurrency, p.lease_ms, g.group_key
        FROM queued g
        JOIN actor_instances i ON i.tenant_id = p_tenant AND i.instance_id = g.instance_id
        JOIN pol p ON p.actor = i.actor
        WHERE i.worker_id = p_worker
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
$function$;
