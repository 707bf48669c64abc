-- yoke_append: the current definition, as the migrations leave it (the last
-- to define it is migrations/0020_append_keyed_fast_path.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_append(p_tenant text, p_path text, p_stream_id text, p_now bigint, p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[], p_source text[], p_correlation text[], p_priority integer[], p_group text[], p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[], p_kernel boolean DEFAULT false, p_data bytea[] DEFAULT NULL::bytea[])
 RETURNS TABLE(o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
 LANGUAGE plpgsql
AS $function$
DECLARE
    s streams%ROWTYPE;
    n integer := cardinality(p_id);
    v_status text[];          -- per event: new | duplicate
    v_seq bigint[];           -- per event: the original offset of a duplicate
    v_eid text[];
    v_at bigint[];
    v_batch text[];           -- per batch (index b + 1): NULL = admitted, else why not
    v_refused text;           -- once a batch lacks credit, later batches wait too
    v_admitted integer[];     -- input positions of the new, admitted events
    v_new integer := 0;       -- offsets taken
    v_events bigint := 0;     -- durable rows written
    v_bytes bigint := 0;
    r record;
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    SELECT * INTO s FROM streams WHERE tenant_id = p_tenant AND path = p_path FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO yoke_tenants VALUES (p_tenant, p_now) ON CONFLICT DO NOTHING;
        INSERT INTO streams (tenant_id, path, stream_id, created_at)
            VALUES (p_tenant, p_path, p_stream_id, p_now) ON CONFLICT DO NOTHING;
        SELECT * INTO s FROM streams WHERE tenant_id = p_tenant AND path = p_path FOR UPDATE;
    END IF;
    IF (p_kernel OR (NOT s.closed AND s.max_unread_events IS NULL AND s.max_unread_bytes IS NULL
                     AND s.max_total_events IS NULL AND s.max_total_bytes IS NULL))
       AND NOT EXISTS (SELECT 1 FROM unnest(p_object) o WHERE o IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM unnest(p_key) k(key)
                       CROSS JOIN LATERAL (
                           SELECT 1 FROM events
                           WHERE tenant_id = p_tenant AND idempotency_key = k.key AND sid + 0 = s.sid
                           LIMIT 1
                       ) e
                       WHERE k.key IS NOT NULL) THEN
        -- Fast path: every event is new (no key it carries is stored yet:
        -- the probe is step 1's, under the same row lock) and admitted.
        INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                            correlation, priority, group_id, idempotency_key, fingerprint, size,
                            data)
        SELECT p_tenant, s.sid, s.head + t.ord, t.id, p_now, t.type, t.payload::json,
               t.metadata::json, t.source::json, t.correlation, t.priority, t.group_id,
               t.key, t.fp, t.size, p_data[t.ord]
        FROM unnest(p_id, p_type, p_payload, p_metadata, p_source, p_correlation, p_priority,
                    p_group, p_size, p_eph, p_key, p_fp)
             WITH ORDINALITY AS t(id, type, payload, metadata, source, correlation, priority,
                                  group_id, size, eph, key, fp, ord)
        WHERE NOT t.eph;
        SELECT count(*), coalesce(sum(t.size), 0) INTO v_events, v_bytes
            FROM unnest(p_size, p_eph) t(size, eph) WHERE NOT t.eph;
        UPDATE streams SET head = s.head + n,
               durable_events = durable_events + v_events,
               durable_bytes = durable_bytes + v_bytes,
               unread_events = unread_events + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_events END,
               unread_bytes = unread_bytes + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_bytes END
            WHERE tenant_id = p_tenant AND sid = s.sid;
        PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
        -- Offsets are head + 1 .. head + n in input order: one row says it all.
        RETURN QUERY SELECT 'ok'::text, s.head + 1, NULL::text, p_now, s.head + n;
        RETURN;
    END IF;

    v_status := array_fill('new'::text, ARRAY[n]);
    v_seq := array_fill(NULL::bigint, ARRAY[n]);
    v_eid := p_id;
    v_at := array_fill(p_now, ARRAY[n]);
    v_batch := array_fill(NULL::text, ARRAY[coalesce((SELECT max(b) FROM unnest(p_batch) b), 0) + 1]);

    -- 1. Idempotency keys, under the stream row lock.
    FOR r IN
        SELECT t.ord, t.b, e.seq, e.id, e.at, e.fingerprint = t.fp AS same
        FROM unnest(p_key, p_fp, p_batch) WITH ORDINALITY AS t(key, fp, b, ord)
        CROSS JOIN LATERAL (
            SELECT seq, id, at, fingerprint FROM events
            WHERE tenant_id = p_tenant AND idempotency_key = t.key AND sid + 0 = s.sid LIMIT 1
        ) e
    LOOP
        IF r.same THEN
            v_status[r.ord] := 'duplicate';
            v_seq[r.ord] := r.seq;
            v_eid[r.ord] := r.id;
            v_at[r.ord] := r.at;
        ELSE
            v_batch[r.b + 1] := 'conflict';
        END IF;
    END LOOP;

    -- 2. Object bindings, each object row locked until the commit (an abort
    -- or a cleanup waits): a new record may only reference an uploaded
    -- object that has not expired; a duplicate counts only when its object
    -- was committed by the record the key found.
    FOR r IN
        SELECT t.ord, t.b, o.state, o.expires_at, o.committed_seq
        FROM unnest(p_object, p_batch) WITH ORDINALITY AS t(obj, b, ord)
        LEFT JOIN LATERAL (
            SELECT state, expires_at, committed_seq FROM objects
            WHERE tenant_id = p_tenant AND sid = s.sid AND object_id = t.obj
            FOR UPDATE
        ) o ON true
        WHERE t.obj IS NOT NULL
    LOOP
        IF (v_status[r.ord] = 'duplicate'
            AND (r.state IS DISTINCT FROM 'committed' OR r.committed_seq IS DISTINCT FROM v_seq[r.ord]))
           OR (v_status[r.ord] = 'new'
               AND (r.state IS DISTINCT FROM 'uploaded' OR r.expires_at < p_now)) THEN
            v_batch[r.b + 1] := coalesce(v_batch[r.b + 1], 'object');
        END IF;
    END LOOP;

    -- 3. Producer credit, batch by batch, from the durable counters.
    FOR r IN
        SELECT t.b,
               count(*) FILTER (WHERE v_status[t.ord] = 'new') AS fresh,
               count(*) FILTER (WHERE NOT t.eph AND v_status[t.ord] = 'new') AS events,
               coalesce(sum(t.size) FILTER (WHERE NOT t.eph AND v_status[t.ord] = 'new'), 0) AS bytes
        FROM unnest(p_batch, p_size, p_eph) WITH ORDINALITY AS t(b, size, eph, ord)
        GROUP BY t.b ORDER BY t.b
    LOOP
        CONTINUE WHEN v_batch[r.b + 1] IS NOT NULL;
        IF s.closed AND r.fresh > 0 AND NOT p_kernel THEN
            v_batch[r.b + 1] := 'closed';
            CONTINUE;
        END IF;
        IF v_refused IS NULL AND r.events > 0 AND NOT p_kernel THEN
            IF s.durable_events + v_events + r.events > s.max_total_events
               OR s.durable_bytes + v_bytes + r.bytes > s.max_total_bytes THEN
                v_refused := 'quota';
            ELSIF s.min_ack IS NOT NULL AND (
                  s.unread_events + v_events + r.events > s.max_unread_events
                  OR s.unread_bytes + v_bytes + r.bytes > s.max_unread_bytes) THEN
                v_refused := 'unread_full';
            END IF;
        END IF;
        IF v_refused IS NOT NULL THEN
            v_batch[r.b + 1] := v_refused;
        ELSE
            v_events := v_events + r.events;
            v_bytes := v_bytes + r.bytes;
        END IF;
    END LOOP;

    -- 4. The admitted new events, in order, take offsets head + 1, head + 2, ...
    SELECT coalesce(array_agg(t.ord ORDER BY t.ord), '{}') INTO v_admitted
    FROM unnest(p_batch) WITH ORDINALITY AS t(b, ord)
    WHERE v_batch[t.b + 1] IS NULL AND v_status[t.ord] = 'new';
    v_new := cardinality(v_admitted);

    INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                        correlation, priority, group_id, idempotency_key, fingerprint, size, data)
    SELECT p_tenant, s.sid, s.head + a.i, p_id[a.ord], p_now, p_type[a.ord],
           p_payload[a.ord]::json, p_metadata[a.ord]::json, p_source[a.ord]::json,
           p_correlation[a.ord], p_priority[a.ord], p_group[a.ord], p_key[a.ord], p_fp[a.ord],
           p_size[a.ord], p_data[a.ord]
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i) WHERE NOT p_eph[a.ord];

    UPDATE objects o SET state = 'committed', committed_seq = s.head + a.i
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i)
    WHERE p_object[a.ord] IS NOT NULL
      AND o.tenant_id = p_tenant AND o.sid = s.sid AND o.object_id = p_object[a.ord]
      AND o.state = 'uploaded';

    UPDATE streams SET head = s.head + v_new,
           durable_events = durable_events + v_events,
           durable_bytes = durable_bytes + v_bytes,
           unread_events = unread_events + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_events END,
           unread_bytes = unread_bytes + CASE WHEN s.min_ack IS NULL THEN 0 ELSE v_bytes END
        WHERE tenant_id = p_tenant AND sid = s.sid;
    IF v_new > 0 THEN
        PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
    END IF;

    RETURN QUERY
    SELECT CASE WHEN v_batch[t.b + 1] IS NOT NULL THEN v_batch[t.b + 1]
                WHEN v_status[t.ord] = 'duplicate' THEN 'duplicate'
                ELSE 'ok' END,
           CASE WHEN v_batch[t.b + 1] IS NOT NULL THEN NULL
                ELSE coalesce(s.head + a.i, v_seq[t.ord]) END,
           v_eid[t.ord], v_at[t.ord], s.head + v_new
    FROM unnest(p_batch) WITH ORDINALITY AS t(b, ord)
    LEFT JOIN unnest(v_admitted) WITH ORDINALITY AS a(ord, i) ON a.ord = t.ord
    ORDER BY t.ord;
END
$function$;
