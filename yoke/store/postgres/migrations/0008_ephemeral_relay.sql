-- Ephemeral events across processes (docs/streams.md, "Ephemeral events
-- across processes"). An ephemeral event is never written; to reach the
-- tails of other processes its body travels in NOTIFY payloads, sent in the
-- append's own transaction, so PostgreSQL delivers them at commit, in commit
-- order, after nothing and before nothing else of that stream.
--
-- PostgreSQL checks no privilege for LISTEN or NOTIFY: any login that can
-- connect to the database could listen on a well-known channel (and read
-- every tenant's ephemeral events) or notify on it (and forge them). The
-- channel's name is therefore a secret: ~190 random bits drawn here, kept
-- in yoke_relay, which only the runtime role (and the tables' owner) can
-- read. A session's LISTEN channels are not visible to other roles.

CREATE TABLE yoke_relay (
    channel text NOT NULL  -- one row
);
INSERT INTO yoke_relay
    SELECT 'yoke_e_' || left(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 48);
REVOKE ALL ON yoke_relay FROM PUBLIC;
GRANT SELECT ON yoke_relay TO yoke_runtime;

-- yoke_append, then one NOTIFY per chunk of each admitted ephemeral event:
-- p_chunk_event[k] is the (1-based) event that chunk k belongs to, and each
-- payload is '<offset>:' || p_chunk[k] (the caller sizes chunks so that the
-- payload stays under PostgreSQL's 8000 bytes). Refused events send nothing.
CREATE FUNCTION yoke_append_relay(
    p_tenant text, p_path text, p_stream_id text, p_now bigint,
    p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[],
    p_source text[], p_correlation text[], p_priority integer[], p_group text[],
    p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[],
    p_channel text, p_chunk_event integer[], p_chunk text[]
) RETURNS TABLE (o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_status text[];
    v_seq bigint[];
    v_id text[];
    v_at bigint[];
    v_head bigint[];
    v_fast boolean;
    v_offset bigint;
    r record;
BEGIN
    SELECT array_agg(a.o_status ORDER BY a.ord), array_agg(a.o_seq ORDER BY a.ord),
           array_agg(a.o_id ORDER BY a.ord), array_agg(a.o_at ORDER BY a.ord),
           array_agg(a.o_head ORDER BY a.ord)
      INTO v_status, v_seq, v_id, v_at, v_head
      FROM yoke_append(p_tenant, p_path, p_stream_id, p_now, p_batch, p_id, p_type, p_payload,
                       p_metadata, p_source, p_correlation, p_priority, p_group, p_key, p_fp,
                       p_size, p_eph, p_object, false)
           WITH ORDINALITY AS a(o_status, o_seq, o_id, o_at, o_head, ord);
    -- yoke_append's fast path answers one row (no id) for consecutive offsets.
    v_fast := cardinality(v_status) = 1 AND v_id[1] IS NULL;
    FOR r IN SELECT c.ev, c.chunk
             FROM unnest(p_chunk_event, p_chunk) WITH ORDINALITY AS c(ev, chunk, ord)
             ORDER BY c.ord
    LOOP
        IF v_fast THEN
            v_offset := v_seq[1] + r.ev - 1;
        ELSIF v_status[r.ev] = 'ok' THEN
            v_offset := v_seq[r.ev];
        ELSE
            CONTINUE;
        END IF;
        PERFORM pg_notify(p_channel, v_offset::text || ':' || r.chunk);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_status, v_seq, v_id, v_at, v_head);
END
$$;

GRANT EXECUTE ON FUNCTION yoke_append_relay TO yoke_runtime;
