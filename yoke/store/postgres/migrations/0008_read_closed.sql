-- yoke_read as in 0005_json_values.sql, with one addition: the stream row's
-- closed flag, read in the same statement as head and the events.
--
-- Why: a tail of a closed stream ends once it has delivered everything up
-- to the head. Taking closed and head from the one row version the events
-- were read against means a tail can never end before an event that was
-- committed ahead of the close, and costs no second query per wake-up.
DROP FUNCTION yoke_read(text, text, bigint, bigint, integer);

CREATE FUNCTION yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint,
                          p_limit integer)
RETURNS TABLE (head bigint, pruned_through bigint, closed boolean, seq bigint, id text, at bigint,
               type text, payload json, metadata json, source json, correlation text,
               priority integer, group_id text, idempotency_key text)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, s.closed, e.seq, e.id, e.at, e.type, e.payload, e.metadata,
           e.source, e.correlation, e.priority, e.group_id, e.idempotency_key
    FROM streams s
    LEFT JOIN LATERAL (
        SELECT ev.* FROM events ev
        WHERE ev.tenant_id = s.tenant_id AND ev.sid = s.sid
          AND ev.seq > p_after AND ev.seq <= p_upto
        ORDER BY ev.seq LIMIT p_limit
    ) e ON true
    WHERE s.tenant_id = p_tenant AND s.path = p_path;
END
$$;

GRANT EXECUTE ON FUNCTION yoke_read TO yoke_runtime;
