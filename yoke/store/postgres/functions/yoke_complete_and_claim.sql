-- yoke_complete_and_claim: the current definition, as the migrations leave it (the last
-- to define it is migrations/0033_actor_inputs.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_complete_and_claim(p_tenant text, p_worker text, p_actors text[], p_conc integer[], p_lease bigint[], p_now bigint, p_limit integer, p_done bigint[], p_done_attempts integer[], p_done_at bigint[], p_done_versions text[], p_done_tapes text[], p_done_kept boolean[], p_shard integer, p_shards integer, p_from_instance text, p_from_group text)
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
