-- The journal of actor runs' effects (docs/effects.md). A run of a queue row
-- records each effect it performs (a schedule upserted or cancelled, a child
-- instance created, a conversation message posted) in the transaction of
-- the effect: the queue row, the op's content digest (op name and canonical
-- params) and which occurrence of that content in the run it is, with the
-- op's result. A retry of the row making the same op gets the recorded
-- result and performs nothing. Appends need no row here: their idempotency
-- key is derived from the same parts (yoke:run:...).
-- The rows go with their queue row (completed, dropped, instance removed);
-- a dead-lettered row keeps them, so a redrive does not repeat its effects.
CREATE TABLE actor_effects (
    tenant_id  text    NOT NULL,
    qid        bigint  NOT NULL,
    digest     text    NOT NULL,
    occurrence integer NOT NULL,
    result     json    NOT NULL,
    PRIMARY KEY (tenant_id, qid, digest, occurrence),
    FOREIGN KEY (tenant_id, qid) REFERENCES actor_queue (tenant_id, qid) ON DELETE CASCADE
);

ALTER TABLE actor_effects ENABLE ROW LEVEL SECURITY;
ALTER TABLE actor_effects FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON actor_effects
    USING (tenant_id = current_setting('yoke.tenant', true))
    WITH CHECK (tenant_id = current_setting('yoke.tenant', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON actor_effects TO yoke_runtime;
