-- An instance's database image read and written in one round trip each: a
-- statement of its own that enters the tenant itself, as yoke_claim does,
-- where a transaction (BEGIN and the tenant, the statement, COMMIT) took
-- three. pg_sqlite storage reads an image when it opens an instance and
-- writes one after every run that wrote. New functions: the build before
-- this one does not call them.
CREATE FUNCTION public.yoke_load_state(p_tenant text, p_instance text)
 RETURNS bytea
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    RETURN (SELECT s.data FROM actor_sqlite s WHERE s.tenant_id = p_tenant AND s.instance_id = p_instance);
END
$function$;

CREATE FUNCTION public.yoke_save_state(p_tenant text, p_instance text, p_data bytea, p_now bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM yoke_enter_tenant(p_tenant);
    INSERT INTO actor_sqlite (tenant_id, instance_id, data, updated_at) VALUES (p_tenant, p_instance, p_data, p_now)
    ON CONFLICT (tenant_id, instance_id) DO UPDATE SET data = EXCLUDED.data, updated_at = EXCLUDED.updated_at;
END
$function$;

GRANT EXECUTE ON FUNCTION yoke_load_state, yoke_save_state TO yoke_runtime;
