-- yoke_enter_tenant: the current definition, as the migrations leave it (the last
-- to define it is migrations/0002_actors.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_enter_tenant(p_tenant text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
END
$function$;
