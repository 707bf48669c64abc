-- Streams and their events. Every key starts with tenant_id (so the schema
-- can be distributed by tenant); every tenant table has FORCE'd row-level
-- security keyed on the transaction-local setting yoke.tenant.

-- The role the runtime works through: no BYPASSRLS, not a superuser.
-- Roles are cluster-wide, so several databases may race to create it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'yoke_runtime') THEN
        CREATE ROLE yoke_runtime NOLOGIN NOBYPASSRLS;
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

ALTER TABLE streams ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streams
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));

GRANT SELECT, INSERT ON yoke_tenants TO yoke_runtime;
GRANT SELECT, INSERT, UPDATE, DELETE ON streams, events TO yoke_runtime;

-- Group commit in one round trip: set the tenant, lock (or create) the
-- stream row, resolve idempotency keys (a caller batch with a conflicting
-- key is rejected whole), number the accepted events from head + 1, insert
-- the durable ones, raise the head and NOTIFY (delivered at commit).
-- Returns one row per input event, in input order, or, when no event has an
-- idempotency key, a single 'ok' row carrying the first offset; a closed
-- stream returns a single row with status 'closed' and writes nothing.
CREATE FUNCTION yoke_append(
    p_tenant text, p_path text, p_stream_id text, p_now bigint,
    p_batch integer[], p_id text[], p_type text[], p_payload text[], p_metadata text[],
    p_source text[], p_correlation text[], p_priority integer[], p_group text[],
    p_key text[], p_fp text[], p_size integer[], p_eph boolean[]
) RETURNS TABLE (o_status text, o_seq bigint, o_id text, o_at bigint, o_head bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_sid bigint;
    v_head bigint;
    v_closed boolean;
    v_has_keys boolean := EXISTS (SELECT 1 FROM unnest(p_key) k WHERE k IS NOT NULL);
BEGIN
    PERFORM set_config('yoke.tenant', p_tenant, true);
    SELECT s.sid, s.head, s.closed INTO v_sid, v_head, v_closed
        FROM streams s WHERE s.tenant_id = p_tenant AND s.path = p_path FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO yoke_tenants VALUES (p_tenant, p_now) ON CONFLICT DO NOTHING;
        INSERT INTO streams (tenant_id, path, stream_id, created_at)
            VALUES (p_tenant, p_path, p_stream_id, p_now) ON CONFLICT DO NOTHING;
        SELECT s.sid, s.head, s.closed INTO v_sid, v_head, v_closed
            FROM streams s WHERE s.tenant_id = p_tenant AND s.path = p_path FOR UPDATE;
    END IF;
    IF v_closed THEN
        RETURN QUERY SELECT 'closed'::text, NULL::bigint, NULL::text, NULL::bigint, v_head;
        RETURN;
    END IF;

    IF NOT v_has_keys THEN
        -- Fast path: no idempotency keys, every event is new.
        INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                            correlation, priority, group_id, idempotency_key, fingerprint, size)
        SELECT p_tenant, v_sid, v_head + t.ord, t.id, p_now, t.type, t.payload::jsonb,
               t.metadata::jsonb, t.source::jsonb, t.correlation, t.priority, t.group_id,
               NULL, t.fp, t.size
        FROM unnest(p_id, p_type, p_payload, p_metadata, p_source, p_correlation, p_priority,
                    p_group, p_fp, p_size, p_eph)
             WITH ORDINALITY AS t(id, type, payload, metadata, source, correlation, priority,
                                  group_id, fp, size, eph, ord)
        WHERE NOT t.eph;
        UPDATE streams SET head = v_head + cardinality(p_id)
            WHERE tenant_id = p_tenant AND sid = v_sid;
        PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
        -- Offsets are head + 1 .. head + n in input order: one row says it all.
        RETURN QUERY SELECT 'ok'::text, v_head + 1, NULL::text, p_now, v_head + cardinality(p_id);
        RETURN;
    END IF;

    RETURN QUERY
    WITH inp AS (
        SELECT * FROM unnest(p_batch, p_id, p_type, p_payload, p_metadata, p_source,
                             p_correlation, p_priority, p_group, p_key, p_fp, p_size, p_eph)
            WITH ORDINALITY AS t(b, id, type, payload, metadata, source, correlation,
                                 priority, group_id, key, fp, size, eph, ord)
    ), prior AS (
        SELECT inp.ord, e.seq, e.id, e.at, e.fingerprint = inp.fp AS same
        FROM inp JOIN events e
          ON e.tenant_id = p_tenant AND e.sid = v_sid AND e.idempotency_key = inp.key
    ), rejected AS (
        SELECT DISTINCT inp.b FROM inp JOIN prior ON prior.ord = inp.ord WHERE NOT prior.same
    ), fresh AS (
        SELECT inp.*, v_head + row_number() OVER (ORDER BY inp.ord) AS seq
        FROM inp
        WHERE inp.b NOT IN (SELECT b FROM rejected)
          AND inp.ord NOT IN (SELECT ord FROM prior)
    ), ins AS (
        INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,
                            correlation, priority, group_id, idempotency_key, fingerprint, size)
        SELECT p_tenant, v_sid, f.seq, f.id, p_now, f.type, f.payload::jsonb, f.metadata::jsonb,
               f.source::jsonb, f.correlation, f.priority, f.group_id, f.key, f.fp, f.size
        FROM fresh f WHERE NOT f.eph
    ), upd AS (
        UPDATE streams SET head = v_head + (SELECT count(*) FROM fresh)
        WHERE tenant_id = p_tenant AND sid = v_sid
        RETURNING head
    )
    SELECT CASE WHEN inp.b IN (SELECT b FROM rejected) THEN 'conflict'
                WHEN prior.ord IS NOT NULL THEN 'duplicate'
                ELSE 'ok' END,
           CASE WHEN inp.b IN (SELECT b FROM rejected) THEN NULL
                ELSE coalesce(fresh.seq, prior.seq) END,
           coalesce(prior.id, inp.id),
           coalesce(prior.at, p_now),
           (SELECT head FROM upd)
    FROM inp
    LEFT JOIN prior ON prior.ord = inp.ord
    LEFT JOIN fresh ON fresh.ord = inp.ord
    ORDER BY inp.ord;
    -- A wake-up is only a reason to reread: a spurious one (all duplicates)
    -- costs a read, never correctness.
    PERFORM pg_notify('yoke_stream', p_tenant || '|' || p_path);
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
