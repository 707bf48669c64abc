"""Object deletion through a deletion outbox. On SQLite object bytes are files, which no
transaction can delete: the rows that delete objects queue their files in
the same transaction, and a crash after the commit leaves them queued for
the next cleanup pass, never a row without its file nor a file forever. On
PostgreSQL the bytes are a column of the object's row and go with it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yoke

DATA = b"object bytes " * 100
DIGEST = hashlib.sha256(DATA).hexdigest()


async def uploaded(s: yoke.Stream, key: str, commit: bool):
    o = await s.objects.prepare(idempotency_key=key, sha256=DIGEST, size=len(DATA))
    await s.objects.upload(o.object_id, DATA)
    if commit:
        await s.objects.commit(o.object_id, type="file.ready")
    return o


def files(db_url: str, tenant: str) -> list[Path]:
    root = Path(db_url.removeprefix("sqlite:///")).parent / "objects" / tenant
    return sorted(p for p in root.rglob("obj_*") if p.is_file()) if root.exists() else []


async def test_files_queued_when_a_crash_follows_the_commit_are_deleted_later(db_url, tenant, backend, monkeypatch):
    async with yoke.open(db_url, prune_interval_s=3600) as y:
        doomed = y.stream("/doomed", tenant)
        kept = y.stream("/kept", tenant)
        await uploaded(doomed, "a", commit=True)
        aborted = await uploaded(kept, "b", commit=False)
        await kept.objects.abort(aborted.object_id)
        committed = await uploaded(kept, "c", commit=True)
        if backend == "sqlite":
            assert len(files(db_url, tenant)) == 3
            # The process dies right after each commit: nothing drains the queue.
            from yoke.store.sqlite.objects import SqliteObjects

            monkeypatch.setattr(SqliteObjects, "drain_deletions", lambda self: 0)
        await doomed.delete()
        await y.prune()  # the aborted object's row goes
        if backend == "sqlite":
            assert len(files(db_url, tenant)) == 3 and await y.store.pending_deletions() == 2
            monkeypatch.undo()
        else:
            assert await y.store.pending_deletions() == 0
    async with yoke.open(db_url, prune_interval_s=3600) as y:
        await y.prune()  # the next pass deletes what was queued
        assert await y.store.pending_deletions() == 0
        assert await y.stream("/kept", tenant).objects.data(committed.object_id) == DATA
        if backend == "sqlite":
            assert [p.name for p in files(db_url, tenant)] == [committed.object_id]
