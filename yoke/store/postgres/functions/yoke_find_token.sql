-- yoke_find_token: the current definition, as the migrations leave it (the last
-- to define it is migrations/0026_token_expiry.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_find_token(p_token_id text)
 RETURNS TABLE(token_id text, tenant_id text, name text, scopes text[], secret_hash text, created_at bigint, revoked_at bigint, expires_at bigint)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$SELECT t.token_id, t.tenant_id, t.name, t.scopes, t.secret_hash, t.created_at, t.revoked_at, t.expires_at FROM public.tokens t WHERE t.token_id = p_token_id$function$;
