-- yoke_read: the current definition, as the migrations leave it (the last
-- to define it is migrations/0016_durable_streams.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint, p_limit integer, p_max_bytes bigint)
 RETURNS TABLE(head bigint, pruned_through bigint, closed boolean, seq bigint, id text, at bigint, type text, payload json, metadata json, source json, correlation text, priority integer, group_id text, idempotency_key text, size integer, stream_id text, created_at bigint, data bytea)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, s.closed, e.seq, e.id, e.at, e.type, e.payload, e.metadata,
           e.source, e.correlation, e.priority, e.group_id, e.idempotency_key, e.size,
           s.stream_id, s.created_at, e.data
    FROM streams s
    LEFT JOIN LATERAL (
        SELECT w.* FROM (
            SELECT ev.*, sum(ev.size) OVER (ORDER BY ev.seq) AS running,
                   row_number() OVER (ORDER BY ev.seq) AS n
            FROM events ev
            WHERE ev.tenant_id = s.tenant_id AND ev.sid = s.sid
              AND ev.seq > p_after AND ev.seq <= p_upto
            ORDER BY ev.seq LIMIT p_limit
        ) w
        -- the events within the cap, and the first past it (n <= 2 covers
        -- a first event larger than the cap on its own)
        WHERE p_max_bytes IS NULL OR w.n <= 2 OR w.running - w.size <= p_max_bytes
        ORDER BY w.seq
    ) e ON true
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$function$;
