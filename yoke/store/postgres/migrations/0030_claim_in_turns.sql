-- A claim that takes turns: it visits the queued (instance, group)s in key
-- order from where this worker's last pass stopped (p_from_instance,
-- p_from_group), round the end and back, and stops once it found p_limit
-- rows; each returned row names where the next pass begins (o_next_*).
-- yoke_claim visited every queued group on every pass and then kept the
-- best p_limit by priority: with 10,000 keyed instances queued, the claims
-- kept both cores busy and the workers ran 130 events/s. Step by step as
-- the SQLite driver's claim (yoke/store/sqlite/actors.py). A new function
-- next to yoke_claim, which the build before this one still calls
-- (docs/production/upgrades.md).
CREATE FUNCTION public.yoke_claim_in_turns(p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[], p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[], p_shard integer, p_shards integer, p_from_instance text, p_from_group text)
 RETURNS TABLE(o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text, o_seq bigint, o_event json, o_status text, o_attempts integer, o_available_at bigint, o_lease_until bigint, o_worker text, o_enqueued_at bigint, o_started_at bigint, o_error text, o_traceback text, o_actor text, o_next_instance text, o_next_group text)
 LANGUAGE plpgsql
AS $function$
DECLARE
    -- The group to look at next: the first queued group at or after
    -- (v_instance, v_group) (v_step 0), after it (1), or after every group
    -- of v_instance (2).
    v_instance text := p_from_instance;
    v_group text := p_from_group;
    v_step integer := 0;
    v_wrapped boolean := false;
    v_found boolean;
    v_actor text;
    v_policy integer;
    v_qids bigint[] := '{}';
    v_priorities integer[] := '{}';
    v_policies integer[] := '{}';
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
    LOOP
        -- The next queued group, one probe of the claim index.
        IF v_step = 0 THEN
            SELECT q.instance_id, q.group_key INTO v_instance, v_group FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
              AND (q.instance_id, q.group_key) >= (v_instance, v_group)
            ORDER BY q.instance_id, q.group_key LIMIT 1;
        ELSIF v_step = 1 THEN
            SELECT q.instance_id, q.group_key INTO v_instance, v_group FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.status <> 'dead'
              AND (q.instance_id, q.group_key) > (v_instance, v_group)
            ORDER BY q.instance_id, q.group_key LIMIT 1;
        ELSE
            SELECT q.instance_id, q.group_key INTO v_instance, v_group FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.status <> 'dead' AND q.instance_id > v_instance
            ORDER BY q.instance_id, q.group_key LIMIT 1;
        END IF;
        v_found := FOUND;
        IF v_found AND v_wrapped AND (v_instance, v_group) >= (p_from_instance, p_from_group) THEN
            v_found := false;  -- round once: back where this pass began
        END IF;
        IF NOT v_found THEN
            EXIT WHEN v_wrapped OR (p_from_instance = '' AND p_from_group = '');  -- the whole queue seen
            v_instance := ''; v_group := ''; v_step := 0; v_wrapped := true;
            CONTINUE;
        END IF;
        EXIT WHEN cardinality(v_qids) >= p_limit;  -- the next pass begins at this group
        v_actor := NULL;
        IF p_shards <= 1 OR mod(hashtext(v_instance) & 2147483647, p_shards) = p_shard THEN
            -- An instance that just changed hands waits until its previous
            -- owner's leases end: two workers never run one instance (each
            -- has its own copy of the instance's database).
            SELECT i.actor INTO v_actor FROM actor_instances i
            WHERE i.tenant_id = p_tenant AND i.instance_id = v_instance AND i.worker_id = p_worker
              AND i.claimable_after <= p_now;
        END IF;
        v_policy := array_position(p_actors, v_actor);
        IF v_policy IS NULL THEN
            v_step := 2;  -- not this worker's (or shard's) to run: its other groups neither
            CONTINUE;
        END IF;
        v_step := 1;
        -- Up to the group's free slots, best first (a lease that expired
        -- frees its slot and makes its row claimable again).
        SELECT v_qids || coalesce(array_agg(c.qid ORDER BY c.priority DESC, c.qid), '{}'),
               v_priorities || coalesce(array_agg(c.priority ORDER BY c.priority DESC, c.qid), '{}')
        INTO v_qids, v_priorities
        FROM (
            SELECT q.qid, q.priority FROM actor_queue q
            WHERE q.tenant_id = p_tenant AND q.instance_id = v_instance AND q.group_key = v_group
              AND q.status <> 'dead'
              AND ((q.status = 'pending' AND q.available_at <= p_now)
                   OR (q.status = 'processing' AND q.lease_until <= p_now))
            ORDER BY q.priority DESC, q.qid
            LIMIT greatest(p_conc[v_policy] - (
                SELECT count(*) FROM actor_queue b
                WHERE b.tenant_id = p_tenant AND b.instance_id = v_instance AND b.group_key = v_group
                  AND b.status = 'processing' AND b.lease_until > p_now), 0)
        ) c;
        v_policies := v_policies || array_fill(v_policy, ARRAY[cardinality(v_qids) - cardinality(v_policies)]);
    END LOOP;
    IF NOT v_found THEN
        v_instance := ''; v_group := '';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT c.qid, p_lease[c.policy] AS lease_ms, p_actors[c.policy] AS actor
        FROM unnest(v_qids, v_priorities, v_policies) AS c(qid, priority, policy)
        ORDER BY c.priority DESC, c.qid
        LIMIT p_limit
    ), locked AS (
        -- The claimable condition again: rechecked on the latest row version
        -- should a competing claim have committed since this pass began.
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
            q.last_traceback, p.actor, v_instance, v_group;
END
$function$;
