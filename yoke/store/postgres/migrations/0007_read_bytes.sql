-- Reads capped by bytes as well as by count.
--
-- A page of yoke_read was bounded only by p_limit (up to 10,000 events):
-- with events of 64 KiB, one page was 640 MiB of rows, built in memory for
-- each reader (every SSE tail at its own cursor). yoke_read now takes
-- p_max_bytes (NULL: no byte cap) and returns each event's stored size: it
-- returns the events while their running total of sizes stays within
-- p_max_bytes (always the first one, whatever its size), plus the first
-- event past the cap, which the caller drops: it tells the caller that the
-- cap, not the head, ended the page. Later rows are not returned, so their
-- documents are never detoasted or sent.

DROP FUNCTION yoke_read(text, text, bigint, bigint, integer);

CREATE FUNCTION yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint,
                          p_limit integer, p_max_bytes bigint)
RETURNS TABLE (head bigint, pruned_through bigint, closed boolean, seq bigint, id text, at bigint,
               type text, payload json, metadata json, source json, correlation text,
               priority integer, group_id text, idempotency_key text, size integer)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, s.closed, e.seq, e.id, e.at, e.type, e.payload, e.metadata,
           e.source, e.correlation, e.priority, e.group_id, e.idempotency_key, e.size
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
