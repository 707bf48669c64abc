-- Sign-in is the only path that reads a token across tenants, and it only reads.
--
-- Until now the tokens policy also admitted any row whose id the transaction
-- named in yoke.token_id, for every command and with or without a tenant:
-- a runtime transaction that set yoke.token_id to another tenant's token id
-- could SELECT, UPDATE (revoke) or DELETE that tenant's token. Now the table
-- policy is tenant-bound like every other table's, and the sign-in lookup is
-- one SECURITY DEFINER function, yoke_find_token(token_id), which returns
-- that one row and nothing else. A runtime transaction can no longer name a
-- token into view: not for reading, and never for changing it.

DROP POLICY tenant_isolation ON tokens;
CREATE POLICY tenant_isolation ON tokens
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));

-- The function runs as its owner: the login applying this migration, which
-- owns the table. Row-level security is FORCE'd, so it applies to the owner
-- too unless the owner is a superuser or has BYPASSRLS; for such an owner
-- (and only for it: the policy names the role, never yoke_runtime) a
-- SELECT-only policy lets the function see the row it looks up. A runtime
-- that logs in as that same owner role could read every token row (hashes
-- only) through it, but an owner can switch row-level security off anyway:
-- give the runtime a role of its own (the default, yoke_runtime).
DO $$
BEGIN
    IF NOT (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user) THEN
        CREATE POLICY token_lookup ON tokens FOR SELECT TO CURRENT_USER USING (true);
    END IF;
END
$$;

-- A SECURITY DEFINER function must not resolve names through a schema its
-- caller controls: the table is named with its schema (resolved now, where
-- 0001 created it), and the search path holds only pg_catalog, then pg_temp
-- (listed last, so a caller's temporary table cannot shadow anything).
DO $$
DECLARE
    tokens_schema text := (
        SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'tokens'::regclass
    );
BEGIN
    EXECUTE format(
        'CREATE FUNCTION %I.yoke_find_token(p_token_id text)'
        ' RETURNS TABLE (token_id text, tenant_id text, name text, scopes text[],'
        '                secret_hash text, created_at bigint, revoked_at bigint)'
        ' LANGUAGE sql STABLE SECURITY DEFINER'
        ' SET search_path = pg_catalog, pg_temp'
        ' AS %L',
        tokens_schema,
        format(
            'SELECT t.token_id, t.tenant_id, t.name, t.scopes, t.secret_hash, t.created_at,'
            ' t.revoked_at FROM %I.tokens t WHERE t.token_id = p_token_id',
            tokens_schema));
    EXECUTE format('REVOKE ALL ON FUNCTION %I.yoke_find_token(text) FROM PUBLIC', tokens_schema);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.yoke_find_token(text) TO yoke_runtime', tokens_schema);
END
$$;
