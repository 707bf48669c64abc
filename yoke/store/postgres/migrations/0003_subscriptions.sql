-- Subscriptions: durable deliveries from a source stream (seed 003).
--
-- subscriptions: one row per (source stream, name). The configuration
-- columns (config .. halted) are the reduction of the stream's
-- yoke.subscription.* control events, written in the transaction that
-- appends each control event, and rebuildable from the log. The rest is
-- delivery state that the log does not carry: the cursor
-- (processed_through_offset, only ever advanced by an acknowledgement for the
-- current generation), the retry ladder, counters, and the lease that lets
-- one process at a time deliver the subscription.
CREATE TABLE subscriptions (
    tenant_id        text    NOT NULL,
    path             text    NOT NULL,
    name             text    NOT NULL,
    config           jsonb   NOT NULL,
    configured_at    bigint  NOT NULL,  -- offset of the configure event
    configured_id    text    NOT NULL,  -- its event id (an identical reconfigure returns it)
    configured_ms    bigint  NOT NULL,
    generation       bigint  NOT NULL,  -- offset of the configure or cursor_set event that chose the cursor
    source_stream_id text    NOT NULL,
    halted           jsonb,             -- {offset, attempts, error, version, versions, at_offset} while halted
    gave_up          text,              -- '|v1|v2|': versions that halted it since its last delivery
    processed_through_offset bigint NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,  -- consecutive failed attempts
    skips            integer NOT NULL DEFAULT 0,  -- consecutive skipped events
    last_error       text,
    next_retry_at    bigint  NOT NULL DEFAULT 0,  -- ms
    delivered        bigint  NOT NULL DEFAULT 0,
    failures         bigint  NOT NULL DEFAULT 0,
    secret           text,              -- webhook signing secret (never in the log)
    lease_owner      text,
    lease_until      bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, path, name)
);
CREATE INDEX subscriptions_receiver ON subscriptions (tenant_id, (config->>'target'));

-- The receiver's passive fence: one record per (source path, name), from the
-- stamps of the copies it committed. A batch with an older stamp (an older
-- source lifetime or a superseded generation) is refused.
CREATE TABLE subscription_inbound (
    tenant_id         text   NOT NULL,
    path              text   NOT NULL,  -- the receiving stream
    source_path       text   NOT NULL,
    name              text   NOT NULL,
    source_stream_id  text   NOT NULL,
    source_created_at bigint NOT NULL,
    generation        bigint NOT NULL,
    received          bigint NOT NULL DEFAULT 0,
    last_received_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, path, source_path, name)
);

-- A stream processor's checkpoint: the folded state through an offset, for
-- one processor version, one source lifetime and one delivery run
-- (generation). complete = false while a rebuild is still replaying (it
-- resumes from ``through``).
CREATE TABLE processor_checkpoints (
    tenant_id  text    NOT NULL,
    path       text    NOT NULL,
    name       text    NOT NULL,
    version    text    NOT NULL,
    stream_id  text    NOT NULL,
    generation bigint  NOT NULL,
    through    bigint  NOT NULL,
    state      jsonb   NOT NULL,
    complete   boolean NOT NULL,
    updated_at bigint  NOT NULL,
    PRIMARY KEY (tenant_id, path, name)
);

-- The tenants that have (or had) subscriptions, names only and outside
-- row-level security like yoke_tenants: the delivery engine's claim visits
-- these tenants, not every tenant, on each sweep.
CREATE TABLE subscription_tenants (
    tenant_id text PRIMARY KEY
);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['subscriptions', 'subscription_inbound', 'processor_checkpoints'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I'
            ' USING (tenant_id = current_setting(''yoke.tenant'', true))'
            ' WITH CHECK (tenant_id = current_setting(''yoke.tenant'', true))', t);
    END LOOP;
END
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON subscriptions, subscription_inbound,
    processor_checkpoints TO yoke_runtime;
GRANT SELECT, INSERT ON subscription_tenants TO yoke_runtime;
