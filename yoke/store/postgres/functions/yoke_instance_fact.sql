-- yoke_instance_fact: the current definition, as the migrations leave it (the last
-- to define it is migrations/0013_lifecycle.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_instance_fact()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    i actor_instances%ROWTYPE;
    v_type text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        i := OLD;
        v_type := 'yoke.instance.removed';
    ELSE
        i := NEW;
        v_type := CASE TG_OP WHEN 'INSERT' THEN 'yoke.instance.created' ELSE 'yoke.instance.adopted' END;
    END IF;
    PERFORM yoke_fact(i.tenant_id, v_type,
        json_build_object('instance_id', i.instance_id, 'actor', i.actor, 'key', i.key,
                          'parent_id', i.parent_id, 'worker_id', i.worker_id),
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    RETURN NULL;
END $function$;
