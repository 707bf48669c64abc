-- yoke_read_stored: the current definition, as the migrations leave it (the last
-- to define it is migrations/0021_read_stored_page.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_read_stored(p_tenant text, p_path text, p_after bigint, p_limit integer, p_max_bytes bigint)
 RETURNS TABLE(head bigint, pruned_through bigint, closed boolean, stream_id text, created_at bigint, counted bigint, page text)
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
    SELECT s.head, s.pruned_through, s.closed, s.stream_id, s.created_at, w.counted, w.page
    FROM streams s
    LEFT JOIN LATERAL (
        SELECT count(*) AS counted,
               (json_agg(json_build_array(x.seq, x.type, x.payload::text, x.size, encode(x.data, 'hex'))
                         ORDER BY x.seq)
                    FILTER (WHERE x.n = 1 OR p_max_bytes IS NULL OR x.running <= p_max_bytes))::text AS page
        FROM (
            SELECT ev.seq, ev.type, ev.payload, ev.size, ev.data,
                   sum(ev.size) OVER (ORDER BY ev.seq) AS running,
                   row_number() OVER (ORDER BY ev.seq) AS n
            FROM events ev
            WHERE ev.tenant_id = s.tenant_id AND ev.sid = s.sid AND ev.seq > p_after
            ORDER BY ev.seq LIMIT p_limit
        ) x
    ) w ON true
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$function$;
