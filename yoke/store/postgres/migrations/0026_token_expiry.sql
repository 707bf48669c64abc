-- Tokens may expire (docs/production/security.md): the time, in ms since the
-- epoch, from which the token is refused with token_expired; NULL: never.
-- Numbered 0026, not 0024: 0024 and 0025 are taken by work on other branches.
ALTER TABLE tokens ADD COLUMN expires_at bigint;

-- yoke_find_token (0006) returns the column too. Its row type changes, so
-- it is dropped and made again, as 0006 made it (the table named with its
-- schema; the search path pg_catalog, then pg_temp), and EXECUTE is granted
-- again to every role that had it (the runtime role, whatever its name).
DO $$
DECLARE
    tokens_schema text := (
        SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'tokens'::regclass
    );
    grantees text[];
    grantee text;
BEGIN
    grantees := ARRAY(
        SELECT r.rolname
        FROM pg_proc p, LATERAL aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
        WHERE p.oid = format('%I.yoke_find_token(text)', tokens_schema)::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    );
    EXECUTE format('DROP FUNCTION %I.yoke_find_token(text)', tokens_schema);
    EXECUTE format(
        'CREATE FUNCTION %I.yoke_find_token(p_token_id text)'
        ' RETURNS TABLE (token_id text, tenant_id text, name text, scopes text[],'
        '                secret_hash text, created_at bigint, revoked_at bigint, expires_at bigint)'
        ' LANGUAGE sql STABLE SECURITY DEFINER'
        ' SET search_path = pg_catalog, pg_temp'
        ' AS %L',
        tokens_schema,
        format(
            'SELECT t.token_id, t.tenant_id, t.name, t.scopes, t.secret_hash, t.created_at,'
            ' t.revoked_at, t.expires_at FROM %I.tokens t WHERE t.token_id = p_token_id',
            tokens_schema));
    EXECUTE format('REVOKE ALL ON FUNCTION %I.yoke_find_token(text) FROM PUBLIC', tokens_schema);
    FOREACH grantee IN ARRAY grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.yoke_find_token(text) TO %I', tokens_schema, grantee);
    END LOOP;
END
$$;
