-- Streams and their events. Every key starts with tenant_id (so the schema
-- can be distributed by tenant); every tenant table has FORCE'd row-level
-- security keyed on the transaction-local setting yoke.tenant.

-- The role the runtime logs in as: no BYPASSRLS, not a superuser, so row-
-- level security applies to every query it can make. Roles are
-- cluster-wide, so several databases may race to create it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'yoke_runtime') THEN
        CREATE ROLE yoke_runtime LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    ELSIF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'yoke_runtime') THEN
        ALTER ROLE yoke_runtime LOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;

-- The tenant directory: names only, so maintenance passes can visit every
-- tenant while each visit still runs under that tenant's RLS setting.
CREATE TABLE yoke_tenants (
    tenant_id  text PRIMARY KEY,
    created_at bigint NOT NULL
);

CREATE TABLE streams (
    tenant_id      text    NOT NULL,
    path           text    COLLATE "C" NOT NULL,
    sid            bigint  GENERATED ALWAYS AS IDENTITY,  -- internal key used by events
    stream_id      text    NOT NULL,                      -- random lifetime id, public
    created_at     bigint  NOT NULL,                      -- ms since epoch
    head           bigint  NOT NULL DEFAULT 0,            -- highest offset ever assigned
    pruned_through bigint  NOT NULL DEFAULT 0,            -- retention removed offsets <= this
    closed         boolean NOT NULL DEFAULT false,
    legal_hold     boolean NOT NULL DEFAULT false,
    max_age_s      double precision,
    max_events     bigint,
    -- Producer credit, kept exact in the same transactions that insert,
    -- acknowledge and prune: retained durable events, and the durable events
    -- after the minimum consumer acknowledgement (min_ack; NULL: no consumer).
    durable_events bigint  NOT NULL DEFAULT 0,
    durable_bytes  bigint  NOT NULL DEFAULT 0,
    min_ack        bigint,
    unread_events  bigint  NOT NULL DEFAULT 0,
    unread_bytes   bigint  NOT NULL DEFAULT 0,
    max_unread_events bigint,
    max_unread_bytes  bigint,
    max_total_events  bigint,
    max_total_bytes   bigint,
    overflow       text    NOT NULL DEFAULT 'reject' CHECK (overflow IN ('reject', 'block')),
    block_timeout_s double precision NOT NULL DEFAULT 5,
    -- A pinned stream (a seed-004 definition) keeps its retention, limits
    -- and metadata for life.
    pinned         boolean NOT NULL DEFAULT false,
    metadata       jsonb   NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, path),
    UNIQUE (tenant_id, sid)
);

CREATE TABLE events (
    tenant_id       text    NOT NULL,
    sid             bigint  NOT NULL,
    seq             bigint  NOT NULL,
    id              text    NOT NULL,
    at              bigint  NOT NULL,
    type            text    NOT NULL,
    payload         jsonb   NOT NULL,
    metadata        jsonb   NOT NULL,
    source          jsonb,
    correlation     text,
    priority        integer NOT NULL DEFAULT 0,
    group_id        text,
    idempotency_key text,
    fingerprint     text,              -- set when there is an idempotency_key
    size            integer NOT NULL,
    PRIMARY KEY (tenant_id, sid, seq)
);

CREATE UNIQUE INDEX events_idempotency
    ON events (tenant_id, sid, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Named consumers of a stream and how far each has acknowledged.
CREATE TABLE consumers (
    tenant_id   text   NOT NULL,
    sid         bigint NOT NULL,
    consumer_id text   NOT NULL,
    acked       bigint NOT NULL,
    created_at  bigint NOT NULL,
    updated_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, sid, consumer_id)
);

-- Large objects: prepared -> uploaded -> committed (bound to one record),
-- or aborted / expired and removed by the cleanup pass.
CREATE TABLE objects (
    tenant_id       text   NOT NULL,
    sid             bigint NOT NULL,
    object_id       text   NOT NULL,
    idempotency_key text   NOT NULL,
    sha256          text   NOT NULL,
    size            bigint NOT NULL,
    content_type    text   NOT NULL,
    state           text   NOT NULL CHECK (state IN ('prepared', 'uploaded', 'committed', 'aborted')),
    created_at      bigint NOT NULL,
    expires_at      bigint NOT NULL,
    committed_seq   bigint,
    data            bytea,
    PRIMARY KEY (tenant_id, sid, object_id),
    UNIQUE (tenant_id, sid, idempotency_key)
);

-- API tokens: only a hash of the secret is stored.
CREATE TABLE tokens (
    tenant_id   text    NOT NULL,
    token_id    text    NOT NULL,
    name        text    NOT NULL,
    scopes      text[]  NOT NULL,
    secret_hash text    NOT NULL,
    created_at  bigint  NOT NULL,
    revoked_at  bigint,
    PRIMARY KEY (tenant_id, token_id),
    UNIQUE (token_id)
);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['streams', 'events', 'consumers', 'objects'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I'
            ' USING (tenant_id = current_setting(''yoke.tenant'', true))'
            ' WITH CHECK (tenant_id = current_setting(''yoke.tenant'', true))', t);
    END LOOP;
END
$$;

-- Authentication looks a token up by its public id before the tenant is
-- known: a transaction may see the one token row whose id it names in
-- yoke.token_id (useless without the secret), and otherwise only its
-- tenant's tokens.
ALTER TABLE tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE tokens FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tokens
    USING (tenant_id = current_setting('yoke.tenant', true)
           OR token_id = current_setting('yoke.token_id', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));

GRANT SELECT, INSERT ON yoke_tenants TO yoke_runtime;
GRANT SELECT ON yoke_schema_version TO yoke_runtime;  -- /readyz checks it
GRANT SELECT, INSERT, UPDATE, DELETE ON streams, events, consumers, objects, tokens TO yoke_runtime;

-- Group commit in one round trip: set the tenant, lock (or create) the
-- stream row, resolve idempotency keys (a caller batch with a conflicting
-- key is rejected whole), check object bindings and producer credit batch
-- by batch (admitted batches form a prefix), number the accepted events
-- from head + 1, insert the durable ones, bind committed objects, update
-- the head and credit counters, and NOTIFY (delivered at commit).
--
-- Returns one row per input event, in input order, with status ok,
-- duplicate, conflict (a key reused for another event), object (an object
-- not uploaded), closed (the stream takes no new event: a batch of pure
-- duplicates still gets its original offsets), unread_full or quota (no
-- credit); or, on the fast path (open stream, no keys, objects or limits),
-- a single 'ok' row carrying the first offset.
CREATE FUNCTION yoke_append(
    p_tenant text, p_path text, p_stream_id text, p_now bigint,
    p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[],
    p_source text[], p_correlation text[], p_priority integer[], p_group text[],
    p_key text[], p_fp text[], p_size integer[], p_eph boolean[], p_object text[]
) RETURNS TABLE (o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
LANGUAGE plpgsql AS $$
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
    IF NOT s.closed AND s.max_unread_events IS NULL AND s.max_unread_bytes IS NULL
       AND s.max_total_events IS NULL AND s.max_total_bytes IS NULL
       AND NOT EXISTS (SELECT 1 FROM unnest(p_key, p_object) k(key, obj)
                       WHERE k.key IS NOT NULL OR k.obj IS NOT NULL) THEN
        -- Fast path: every event is new and admitted.
        INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                            correlation, priority, group_id, idempotency_key, fingerprint, size)
        SELECT p_tenant, s.sid, s.head + t.ord, t.id, p_now, t.type, t.payload::jsonb,
               t.metadata::jsonb, t.source::jsonb, t.correlation, t.priority, t.group_id,
               NULL, NULL, t.size
        FROM unnest(p_id, p_type, p_payload, p_metadata, p_source, p_correlation, p_priority,
                    p_group, p_size, p_eph)
             WITH ORDINALITY AS t(id, type, payload, metadata, source, correlation, priority,
                                  group_id, size, eph, ord)
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
        JOIN events e ON e.tenant_id = p_tenant AND e.sid = s.sid AND e.idempotency_key = t.key
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

    -- 2. Object bindings: a new record may only reference an uploaded object.
    FOR r IN
        SELECT t.ord, t.b, o.state
        FROM unnest(p_object, p_batch) WITH ORDINALITY AS t(obj, b, ord)
        LEFT JOIN objects o ON o.tenant_id = p_tenant AND o.sid = s.sid AND o.object_id = t.obj
        WHERE t.obj IS NOT NULL
    LOOP
        IF v_status[r.ord] = 'new' AND r.state IS DISTINCT FROM 'uploaded' THEN
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
        IF s.closed AND r.fresh > 0 THEN
            v_batch[r.b + 1] := 'closed';
            CONTINUE;
        END IF;
        IF v_refused IS NULL AND r.events > 0 THEN
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
                        correlation, priority, group_id, idempotency_key, fingerprint, size)
    SELECT p_tenant, s.sid, s.head + a.i, p_id[a.ord], p_now, p_type[a.ord],
           p_payload[a.ord]::jsonb, p_metadata[a.ord]::jsonb, p_source[a.ord]::jsonb,
           p_correlation[a.ord], p_priority[a.ord], p_group[a.ord], p_key[a.ord], p_fp[a.ord],
           p_size[a.ord]
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i) WHERE NOT p_eph[a.ord];

    UPDATE objects o SET state = 'committed', committed_seq = s.head + a.i
    FROM unnest(v_admitted) WITH ORDINALITY AS a(ord, i)
    WHERE p_object[a.ord] IS NOT NULL
      AND o.tenant_id = p_tenant AND o.sid = s.sid AND o.object_id = p_object[a.ord];

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
$$;

-- A page of events in (p_after, p_upto], with the stream's head and
-- pruned_through from the same snapshot, in one round trip. A missing
-- stream returns no rows.
CREATE FUNCTION yoke_read(p_tenant text, p_path text, p_after bigint, p_upto bigint,
                          p_limit integer)
RETURNS TABLE (head bigint, pruned_through bigint, seq bigint, id text, at bigint, type text,
               payload jsonb, metadata jsonb, source jsonb, correlation text, priority integer,
               group_id text, idempotency_key text)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('yoke.tenant', true), '') NOT IN ('', p_tenant) THEN
        RAISE EXCEPTION 'yoke: tenant % does not match the transaction''s tenant', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('yoke.tenant', p_tenant, true);
    RETURN QUERY
    SELECT s.head, s.pruned_through, e.seq, e.id, e.at, e.type, e.payload, e.metadata, e.source,
           e.correlation, e.priority, e.group_id, e.idempotency_key
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

GRANT EXECUTE ON FUNCTION yoke_append, yoke_read TO yoke_runtime;
