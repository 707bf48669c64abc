-- Object deletion through a deletion outbox (seed 004; docs/objects.md):
-- object bytes are files, which a transaction cannot delete. Whatever
-- deletes object rows (the cleanup pass, deleting a stream) queues their
-- files here in the same transaction; the files are deleted after the
-- commit and their rows then; after a crash in between, the next cleanup
-- pass deletes what is left.
CREATE TABLE object_deletions (
    tenant_id TEXT    NOT NULL,
    sid       INTEGER NOT NULL,
    object_id TEXT    NOT NULL,
    queued_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid, object_id)
) WITHOUT ROWID;
