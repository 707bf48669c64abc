-- yoke_append_in_lifetime: the current definition, as the migrations leave it (the last
-- to define it is migrations/0022_append_in_lifetime.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_append_in_lifetime(p_tenant text, p_path text, p_stream_id text, p_now bigint, p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[], p_source text[], p_correlation text[], p_priority integer[], p_group text[], p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[], p_kernel boolean, p_data bytea[], p_lifetime text)
 RETURNS TABLE(o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    PERFORM 1 FROM streams s
        LEFT JOIN protocol_streams p ON p.tenant_id = s.tenant_id AND p.sid = s.sid
        WHERE s.tenant_id = p_tenant AND s.path = p_path AND s.stream_id = p_lifetime
          AND NOT coalesce(p.deleted, false)
        FOR UPDATE OF s;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM yoke_append(
        p_tenant, p_path, p_stream_id, p_now, p_batch, p_id, p_type, p_payload, p_metadata,
        p_source, p_correlation, p_priority, p_group, p_key, p_fp, p_size, p_eph, p_object,
        p_kernel, p_data);
END
$function$;
