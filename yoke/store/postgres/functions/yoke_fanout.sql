-- yoke_fanout: the current definition, as the migrations leave it (the last
-- to define it is migrations/0005_hardening.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_fanout(p_tenant text, p_path text, p_expected bigint, p_through bigint, p_version bigint, p_worker text, p_now bigint, p_instance text[], p_actor text[], p_key text[], p_new_id text[], p_group text[], p_priority integer[], p_seq bigint[], p_event text[])
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
$function$;
