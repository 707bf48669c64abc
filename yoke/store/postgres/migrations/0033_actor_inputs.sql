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
