-- yoke_read_payloads: the current definition, as the migrations leave it (the last
-- to define it is migrations/0023_read_payloads.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_read_payloads(p_tenant text, p_path text, p_after bigint, p_limit integer, p_type text)
 RETURNS TABLE(head bigint, closed boolean, counted bigint, total bigint, others bigint, last_seq bigint, body bytea)
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
    SELECT s.head, s.closed, w.counted, w.total, w.others, w.last_seq, w.body
    FROM streams s
    LEFT JOIN LATERAL (
        SELECT count(*) AS counted, coalesce(sum(x.size), 0)::bigint AS total,
               count(*) FILTER (WHERE x.type <> p_type OR x.data IS NOT NULL) AS others,
               max(x.seq) AS last_seq,
               convert_to('[' || coalesce(string_agg(x.payload::text, ',' ORDER BY x.seq), '') || ']',
                          'UTF8') AS body
        FROM (
            SELECT ev.seq, ev.size, ev.type, ev.payload, ev.data
            FROM events ev
            WHERE ev.tenant_id = s.tenant_id AND ev.sid = s.sid AND ev.seq > p_after
            ORDER BY ev.seq LIMIT p_limit
        ) x
    ) w ON true
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$function$;
