-- yoke_save_state: the current definition, as the migrations leave it (the last
-- to define it is migrations/0031_state_in_one_round_trip.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_save_state(p_tenant text, p_instance text, p_data bytea, p_now bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    INSERT INTO actor_sqlite (tenant_id, instance_id, data, updated_at) VALUES (p_tenant, p_instance, p_data, p_now)
    ON CONFLICT (tenant_id, instance_id) DO UPDATE SET data = EXCLUDED.data, updated_at = EXCLUDED.updated_at;
END
$function$;
