-- A Durable Streams read (Store.read_stored) of a page of events, in one
-- row. yoke_read returns eighteen columns for every event (the stream's
-- among them), each decoded by asyncpg into a record: most of the server's
-- CPU in catch-up reads. A protocol read needs each event's offset, type,
-- payload text, size and bytes only: yoke_read_stored returns the stream's
-- fields, how many events the limit takes, and the kept ones (the first
-- always, then while the running total of sizes stays within p_max_bytes)
-- as one JSON array of [seq, type, payload text, size, hex(data)].
CREATE FUNCTION yoke_read_stored(p_tenant text, p_path text, p_after bigint, p_limit integer,
                                 p_max_bytes bigint)
RETURNS TABLE (head bigint, pruned_through bigint, closed boolean, stream_id text, created_at bigint,
               counted bigint, page text)
LANGUAGE plpgsql AS $$
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
$$;

GRANT EXECUTE ON FUNCTION yoke_read_stored TO yoke_runtime;
