-- The subscription catalogue's own record, per source stream (seed 003:
-- "The persisted reduced state is a rebuildable cache. When it is missing,
-- invalid, or from another reducer version, the stream recreates it by
-- replaying its event log").
--
-- stream_id and reducer: the lifetime and the reducer version the rows of
-- ``subscriptions`` for this path were reduced by; subscriptions: how many
-- rows that catalogue holds (kept by every control transaction), so rows
-- gone missing are seen; stage: an unfinished rebuild's progress
-- ({through, created_at, rows}), saved every few pages and removed in the
-- transaction that promotes the rebuilt rows. A process that opens checks
-- every record (and every path with rows but no record) and rebuilds what
-- does not match, resuming a stage of the same lifetime.
CREATE TABLE subscription_catalogues (
    tenant_id     text   NOT NULL,
    path          text   NOT NULL,
    stream_id     text   NOT NULL,
    reducer       text   NOT NULL,
    subscriptions bigint NOT NULL DEFAULT 0,
    stage         jsonb,
    updated_at    bigint NOT NULL,
    PRIMARY KEY (tenant_id, path)
);

ALTER TABLE subscription_catalogues ENABLE ROW LEVEL SECURITY;
ALTER TABLE subscription_catalogues FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON subscription_catalogues
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));

GRANT SELECT, INSERT, UPDATE, DELETE ON subscription_catalogues TO yoke_runtime;
