-- A repaired live gap leaves evidence (seed 004, "Operations": "gap
-- evidence"; yoke/streams/gaps.py): a tail that found events no wake-up had
-- announced (a lost or late notification, repaired by its periodic reread)
-- records them here for operators. The newest 100 per stream are kept.
CREATE TABLE gap_evidence (
    tenant_id   text   NOT NULL,
    sid         bigint NOT NULL,
    detected_at bigint NOT NULL,
    first_seq   bigint NOT NULL,
    last_seq    bigint NOT NULL,
    cause       text   NOT NULL,
    process     text   NOT NULL,
    PRIMARY KEY (tenant_id, sid, detected_at, first_seq)
);

ALTER TABLE gap_evidence ENABLE ROW LEVEL SECURITY;
ALTER TABLE gap_evidence FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON gap_evidence
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON gap_evidence TO yoke_runtime;
