-- yoke_protocol_stream: the current definition, as the migrations leave it (the last
-- to define it is migrations/0019_protocol_stream_lookup.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_protocol_stream(p_tenant text, p_path text)
 RETURNS TABLE(sid bigint, stream_id text, path text, created_at bigint, head bigint, pruned_through bigint, closed boolean, content_type text, ttl_s bigint, expires_at text, expires_ms bigint, touched_ms bigint, fork_of text, fork_offset bigint, fork_sub bigint, stream_seq text, closed_by text, deleted boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.sid, s.stream_id, s.path::text, s.created_at, s.head, s.pruned_through, s.closed,
           p.content_type, p.ttl_s, p.expires_at, p.expires_ms, p.touched_ms, p.fork_of,
           p.fork_offset, p.fork_sub, p.stream_seq, p.closed_by, p.deleted
    FROM streams s LEFT JOIN protocol_streams p ON p.tenant_id = s.tenant_id AND p.sid = s.sid
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$function$;
