-- An instance's inputs, kept (yoke/store/inputs.py, docs/advanced/forks.md):
-- every queue row a run finished with, written in the transaction that
-- completes the row (yoke_complete_and_claim, commit_run) or buries it as
-- dead (fail), so an input is kept exactly when its row is gone.
--   seq           the instance's input number, 1, 2, ... in the order runs
--                 ended; the transactions that number an instance's inputs
--                 take its advisory lock (24066, hashtext(tenant/instance))
--   path, stream_seq  the stream and offset the event came from (NULL: sent
--                 to the instance directly, a schedule's firing)
--   event         the event document as the run got it
--   attempts, outcome  the attempt that ended it: 'done' (process()
--                 returned) or 'dead' (dead-lettered; last_error says why)
--   code_version  the code that ran it (the deploy version, the app's)
--   tape          what the run did and read outside its own database: its
--                 effect ops and outside reads with their answers, its clock
--                 readings; what a fork replays from
-- Kept while the instance lives (removed with it), pruned by the actor's
-- retention (keep_inputs, keep_inputs_s).
CREATE TABLE actor_inputs (
    tenant_id    text    NOT NULL,
    input_id     bigint  GENERATED ALWAYS AS IDENTITY,
    instance_id  text    NOT NULL,
    seq          bigint  NOT NULL,
    qid          bigint  NOT NULL,
    path         text,
    stream_seq   bigint,
    event        json    NOT NULL,
    attempts     integer NOT NULL,
    outcome      text    NOT NULL CHECK (outcome IN ('done', 'dead')),
    enqueued_at  bigint  NOT NULL,
    started_at   bigint,
    processed_at bigint  NOT NULL,
    code_version text,
    tape         json,
    last_error   text,
    PRIMARY KEY (tenant_id, input_id)
);
CREATE UNIQUE INDEX actor_inputs_instance ON actor_inputs (tenant_id, instance_id, seq);
CREATE INDEX actor_inputs_age ON actor_inputs (tenant_id, processed_at);

ALTER TABLE actor_inputs ENABLE ROW LEVEL SECURITY;
ALTER TABLE actor_inputs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON actor_inputs
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));
GRANT SELECT, INSERT, DELETE ON actor_inputs TO yoke_runtime;

-- Instances that existed before their inputs were kept (or whose actor kept
-- none for a while) have no complete history: a fork of one, which replays
-- from the creation, is refused.
ALTER TABLE actor_instances ADD COLUMN inputs_incomplete boolean NOT NULL DEFAULT false;
UPDATE actor_instances SET inputs_incomplete = true;

-- Forks of instances (yoke/store/forks.py, docs/advanced/forks.md): a
-- sandboxed replay of an instance's inputs 1..upto (NULL: all) under the
-- application's code or another (app: its "module:attribute", NULL: the
-- application of the process that made it), with its input edits, the
-- summary and report of its runs (what each did, its errors) and the
-- image of the SQLite database it ended with. Discarded by hand, or once
-- expires_at passed.
CREATE TABLE actor_forks (
    tenant_id   text    NOT NULL,
    fork_id     text    NOT NULL,
    instance_id text    NOT NULL,
    actor       text    NOT NULL,
    key         text    NOT NULL,
    upto        bigint,
    app         text,
    edits       json    NOT NULL,
    summary     json    NOT NULL,
    report      json    NOT NULL,
    image       bytea   NOT NULL,
    created_at  bigint  NOT NULL,
    expires_at  bigint  NOT NULL,
    PRIMARY KEY (tenant_id, fork_id)
);
CREATE INDEX actor_forks_instance ON actor_forks (tenant_id, instance_id, fork_id);
CREATE INDEX actor_forks_expiry ON actor_forks (tenant_id, expires_at);

ALTER TABLE actor_forks ENABLE ROW LEVEL SECURITY;
ALTER TABLE actor_forks FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON actor_forks
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));
GRANT SELECT, INSERT, DELETE ON actor_forks TO yoke_runtime;

-- yoke_claim_in_turns, as the build before calls it to complete its rows,
-- now marks their instances' kept histories incomplete (it keeps no input).
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

-- Completions kept as inputs, then the claim: yoke_claim_in_turns after the
-- finished rows (p_done, claimed at p_done_attempts, finished at
-- p_done_at by p_done_versions, with p_done_tapes; those p_done_kept) were
-- recorded and deleted in this transaction. A new function: the build before this one
-- still calls yoke_claim_in_turns with its own completions
-- (docs/production/upgrades.md).
CREATE FUNCTION public.yoke_complete_and_claim(p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[], p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[], p_done_at bigint[], p_done_versions text[], p_done_tapes text[], p_done_kept boolean[], p_shard integer, p_shards integer, p_from_instance text, p_from_group text)
 RETURNS TABLE(o_qid bigint, o_tenant text, o_instance text, o_group text, o_priority integer, o_path text, o_seq bigint, o_event json, o_status text, o_attempts integer, o_available_at bigint, o_lease_until bigint, o_worker text, o_enqueued_at bigint, o_started_at bigint, o_error text, o_traceback text, o_actor text, o_next_instance text, o_next_group text)
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    IF cardinality(p_done) > 0 THEN
        -- A lost transaction (synchronous_commit is off, see
        -- yoke_claim_in_turns) loses the input with the delete: the row runs
        -- again and is kept when it ends.
        PERFORM set_config('synchronous_commit', 'off', true);
        -- The instances' inputs are numbered one transaction at a time (a
        -- buried row's, an atomic run's): their locks first, in one order.
        PERFORM pg_advisory_xact_lock(24066, hashtext(p_tenant || '/' || i.instance_id))
        FROM (SELECT DISTINCT q.instance_id FROM actor_queue q
              WHERE q.tenant_id = p_tenant AND q.qid = ANY(p_done) ORDER BY 1) i;
        -- Each finished row that is still the claim that ran (processing, at
        -- its attempts) is deleted and kept as its instance's next input, in
        -- one statement: kept exactly when its row is gone.
        WITH gone AS (
            DELETE FROM actor_queue q
            USING unnest(p_done, p_done_attempts, p_done_at, p_done_versions, p_done_tapes, p_done_kept)
                  WITH ORDINALITY AS d(qid, attempts, at, version, tape, kept, n)
            WHERE q.tenant_id = p_tenant AND q.qid = d.qid AND q.attempts = d.attempts AND q.status = 'processing'
            RETURNING q.tenant_id, q.instance_id, q.qid, q.path, q.seq, q.event, q.attempts, q.enqueued_at,
                      q.started_at, d.at, d.version, d.tape, d.kept, d.n
        )
        INSERT INTO actor_inputs (tenant_id, instance_id, seq, qid, path, stream_seq, event, attempts, outcome,
                                  enqueued_at, started_at, processed_at, code_version, tape)
        SELECT g.tenant_id, g.instance_id,
               coalesce((SELECT max(a.seq) FROM actor_inputs a
                         WHERE a.tenant_id = p_tenant AND a.instance_id = g.instance_id), 0)
                 + row_number() OVER (PARTITION BY g.instance_id ORDER BY g.n),
               g.qid, g.path, g.seq, g.event, g.attempts, 'done', g.enqueued_at, g.started_at,
               g.at, g.version, g.tape::json
        FROM gone g
        WHERE g.kept;
    END IF;
    RETURN QUERY SELECT * FROM yoke_claim_in_turns(p_tenant, p_worker, p_actors, p_conc, p_lease, p_now, p_limit,
                                                   '{}'::bigint[], '{}'::integer[], p_shard, p_shards,
                                                   p_from_instance, p_from_group);
END
$function$;

GRANT EXECUTE ON FUNCTION yoke_complete_and_claim TO yoke_runtime;
