-- A Durable Streams read of a JSON stream (Store.read_payloads): the page's
-- payload texts joined into one JSON array by the database, with what the
-- caller checks before using it: how many events the limit takes, their
-- total size, how many are of another type than p_type or carry bytes, and
-- the last offset. yoke_read_stored's page (0021) is decoded by the server
-- into one object per event and rendered again: most of a catch-up read's
-- CPU once the events were in one row.
CREATE FUNCTION yoke_read_payloads(p_tenant text, p_path text, p_after bigint, p_limit integer,
                                   p_type text)
RETURNS TABLE (head bigint, closed boolean, counted bigint, total bigint, others bigint,
               last_seq bigint, body bytea)
LANGUAGE plpgsql AS $$
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
$$;

GRANT EXECUTE ON FUNCTION yoke_read_payloads TO yoke_runtime;
