-- yoke_append_relay: the current definition, as the migrations leave it (the last
-- to define it is migrations/0008_ephemeral_relay.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_append_relay(p_tenant text, p_path text, p_stream_id text, p_now bigint, p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[], p_source text[], p_correlation text[], p_priority integer[], p_group text[], p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[], p_channel text, p_chunk_event integer[], p_chunk text[])
 RETURNS TABLE(o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
 LANGUAGE plpgsql
AS $function$
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
$function$;
