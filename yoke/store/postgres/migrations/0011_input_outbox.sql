-- Input records and their delivery outbox commit together (seed 004,
-- "Input and large-object recovery"; yoke/streams/inputs.py): one row per
-- input record, written in the record's own append transaction, deleted by
-- a dispatcher once the record's wake event is published.
CREATE TABLE input_outbox (
    tenant_id  text   NOT NULL,
    sid        bigint NOT NULL,
    seq        bigint NOT NULL,
    record_id  text   NOT NULL,
    wake_path  text   NOT NULL,
    created_at bigint NOT NULL,
    attempts   integer NOT NULL DEFAULT 0,
    next_at    bigint NOT NULL,
    error      text,
    PRIMARY KEY (tenant_id, sid, seq)
);
CREATE INDEX input_outbox_due ON input_outbox (tenant_id, next_at);

ALTER TABLE input_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE input_outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON input_outbox
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON input_outbox TO yoke_runtime;
