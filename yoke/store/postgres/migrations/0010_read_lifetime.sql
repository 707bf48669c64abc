-- Reads say which lifetime of the stream they read.
--
-- A stream can be deleted and its path created again (a new stream_id and
-- created_at). A reader that only knew the path (a tail, a subscription's
-- delivery) could not tell the new stream from the old one and would go on
-- from its cursor into the new stream's events. yoke_read now also returns
-- the stream row's stream_id and created_at, from the same row version as
-- head and the events; the columns come last, so the others keep their
-- positions.

DROP FUNCTION yoke_read(text, text, bigint, bigint, integer, bigint);

CREATE FUNCTION yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint,
                          p_limit integer, p_max_bytes bigint)
RETURNS TABLE (head bigint, pruned_through bigint, closed boolean, seq bigint, id text, at bigint,
               type text, payload json, metadata json, source json, correlation text,
               priority integer, group_id text, idempotency_key text, size integer,
               stream_id text, created_at bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, s.closed, e.seq, e.id, e.at, e.type, e.payload, e.metadata,
           e.source, e.correlation, e.priority, e.group_id, e.idempotency_key, e.size,
           s.stream_id, s.created_at
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
$$;

GRANT EXECUTE ON FUNCTION yoke_read TO yoke_runtime;
