-- yoke_load_state: the current definition, as the migrations leave it (the last
-- to define it is migrations/0031_state_in_one_round_trip.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_load_state(p_tenant text, p_instance text)
 RETURNS bytea
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    RETURN (SELECT s.data FROM actor_sqlite s WHERE s.tenant_id = p_tenant AND s.instance_id = p_instance);
END
$function$;
