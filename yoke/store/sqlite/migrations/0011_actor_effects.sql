-- The journal of actor runs' effects (docs/effects.md; the PostgreSQL
-- migration 0017_actor_effects.sql explains it). Foreign keys are not
-- enforced here: a trigger removes a queue row's journal with the row.
CREATE TABLE actor_effects (
    tenant_id  TEXT    NOT NULL,
    qid        INTEGER NOT NULL,
    digest     TEXT    NOT NULL,
    occurrence INTEGER NOT NULL,
    result     TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, qid, digest, occurrence)
) WITHOUT ROWID;

CREATE TRIGGER actor_effects_with_their_row AFTER DELETE ON actor_queue
BEGIN
    DELETE FROM actor_effects WHERE tenant_id = old.tenant_id AND qid = old.qid;
END;
