-- yoke_claim_in_turns: the current definition, as the migrations leave it (the last
-- to define it is migrations/0033_actor_inputs.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_claim_in_turns(p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[], p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[], p_shard integer, p_shards integer, p_from_instance text, p_from_group text)
 RETURNS TABLE(o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text, o_seq bigint, o_event json, o_status text, o_attempts integer, o_available_at bigint, o_lease_until bigint, o_worker text, o_enqueued_at bigint, o_started_at bigint, o_error text, o_traceback text, o_actor text, o_next_instance text, o_next_group text)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_qids bigint[];
    v_leases bigint[];
    v_actors text[];
    v_next_instance text;
    v_next_group text;
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    -- Losing this transaction in a server crash is harmless: a lost claim
    -- leaves its rows pending, a lost delete runs a row again (at least
    -- once). And any later durable commit (a process() side effect) flushes
    -- the WAL this transaction wrote first. So it does not wait for fsync.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF cardinality(p_done) > 0 THEN
        -- Found by primary key (qid = ANY), then fenced by the claim's attempts.
        -- Only a build that keeps no inputs completes rows here (the build
        -- after calls yoke_complete_and_claim): their instances' kept
        -- histories have a gap from now on, and forks refuse them.
        WITH gone AS (
            DELETE FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.qid = ANY(p_done) AND q.status = 'processing'
              AND q.attempts = (SELECT d.attempts FROM unnest(p_done, p_done_attempts) AS d(qid, attempts)
                                WHERE d.qid = q.qid LIMIT 1)
            RETURNING q.instance_id
        )
        UPDATE actor_instances i SET inputs_incomplete = true
        FROM (SELECT DISTINCT instance_id FROM gone) g
        WHERE i.tenant_id = p_tenant AND i.instance_id = g.instance_id AND NOT i.inputs_incomplete;
    END IF;
    IF p_limit <= 0 THEN
        RETURN;
    END IF;
    -- Shared with this worker's other claims, exclusive with its release of
    -- instances (release_excess): a release waits for the claims under
    -- way to commit and sees the rows they took; a claim after it sees the
    -- instance gone.
    PERFORM pg_advisory_xact_lock_shared(24065, hashtext(p_worker));
    -- Every step below is a nested loop fed by the skip scans, so the
    -- statement pulls groups only until the LIMIT has its rows: a pass costs
    -- the groups it visits, not every queued group.
    WITH RECURSIVE after_start(instance_id, group_key) AS (
        -- The queued groups after where the last pass stopped, one probe of
        -- the claim index each ...
        (SELECT q.instance_id, q.group_key FROM actor_queue q
         WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
           AND (q.instance_id, q.group_key) > (p_from_instance, p_from_group)
         ORDER BY q.instance_id, q.group_key LIMIT 1)
        UNION ALL
        SELECT n.instance_id, n.group_key FROM after_start r
        CROSS JOIN LATERAL (
            SELECT q.instance_id, q.group_key FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
              AND (q.instance_id, q.group_key) > (r.instance_id, r.group_key)
            ORDER BY q.instance_id, q.group_key LIMIT 1
        ) n
    ), up_to_start(instance_id, group_key) AS (
        -- ... then round from the first, up to where it stopped.
        (SELECT q.instance_id, q.group_key FROM actor_queue q
         WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
           AND (q.instance_id, q.group_key) <= (p_from_instance, p_from_group)
         ORDER BY q.instance_id, q.group_key LIMIT 1)
        UNION ALL
        SELECT n.instance_id, n.group_key FROM up_to_start r
        CROSS JOIN LATERAL (
            SELECT q.instance_id, q.group_key FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
              AND (q.instance_id, q.group_key) > (r.instance_id, r.group_key)
              AND (q.instance_id, q.group_key) <= (p_from_instance, p_from_group)
            ORDER BY q.instance_id, q.group_key LIMIT 1
        ) n
    ), queued(round, instance_id, group_key) AS (
        SELECT 0, a.instance_id, a.group_key FROM after_start a
        UNION ALL
        SELECT 1, u.instance_id, u.group_key FROM up_to_start u
    ), picked AS (
        SELECT c.qid, p_lease[i.policy] AS lease_ms, p_actors[i.policy] AS actor, g.round, g.instance_id, g.group_key
        FROM queued g
        CROSS JOIN LATERAL (
            -- This worker's to run (its shard's), and not just changed hands:
            -- an instance waits until its previous owner's leases end, so two
            -- workers never run one instance (each has its own copy of the
            -- instance's database).
            SELECT array_position(p_actors, i.actor) AS policy FROM actor_instances i
            WHERE i.tenant_id = p_tenant AND i.instance_id = g.instance_id AND i.worker_id = p_worker
              AND i.claimable_after <= p_now AND i.actor = ANY(p_actors)
              AND (p_shards <= 1 OR mod(hashtext(i.instance_id) & 2147483647, p_shards) = p_shard)
            LIMIT 1
        ) i
        CROSS JOIN LATERAL (
            -- Up to the group's free slots, best first (a lease that expired
            -- frees its slot and makes its row claimable again).
            SELECT q.qid FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.instance_id = g.instance_id AND q.group_key = g.group_key
              AND q.status <> 'dead'
              AND ((q.status = 'pending' AND q.available_at <= p_now)
                   OR (q.status = 'processing' AND q.lease_until <= p_now))
            ORDER BY q.priority DESC, q.qid
            LIMIT greatest(p_conc[i.policy] - (
                SELECT count(*) FROM actor_queue b
                WHERE b.tenant_id = p_tenant AND b.instance_id = g.instance_id AND b.group_key = g.group_key
                  AND b.status = 'processing' AND b.lease_until > p_now), 0)
        ) c
        LIMIT p_limit
    )
    SELECT array_agg(p.qid), array_agg(p.lease_ms), array_agg(p.actor),
           -- The last group visited: the next pass begins after it.
           (array_agg(p.instance_id ORDER BY p.round DESC, p.instance_id DESC, p.group_key DESC))[1],
           (array_agg(p.group_key ORDER BY p.round DESC, p.instance_id DESC, p.group_key DESC))[1]
    INTO v_qids, v_leases, v_actors, v_next_instance, v_next_group
    FROM picked p;
    IF v_qids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT * FROM unnest(v_qids, v_leases, v_actors) AS c(qid, lease_ms, actor)
    ), locked AS (
        -- The claimable condition again: rechecked on the latest row version
        -- should a competing claim have committed since this pass began.
        SELECT q.qid FROM actor_queue q
        WHERE q.tenant_id = p_tenant AND q.qid = ANY(v_qids)
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
            q.last_traceback, p.actor, v_next_instance, v_next_group;
END
$function$;
