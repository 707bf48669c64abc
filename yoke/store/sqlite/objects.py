"""Large objects on SQLite: intents, uploads and their bytes (files beside
the database, under objects/), aborts and cleanup, and the deletion outbox
(migration 0007) that removes the files of deleted rows after the commit."""

from __future__ import annotations

import os
import sqlite3
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from ... import errors
from ...files import open_private, private_dir
from ..faults import retry_reads
from ..results import ObjectInfo
from ..rows import OBJECT_COLUMNS, check_object_bytes, object_from_row
from .appends import SqliteAppends
from .connection import SqliteDb

# An object's row by stream path, with its stream's sid and closed flag.
OBJECT_SELECT = (
    f"SELECT {', '.join('o.' + c.strip() for c in OBJECT_COLUMNS.split(','))}, s.sid, s.closed"
    " FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
    " WHERE s.tenant_id=? AND s.path=? AND o.object_id=?"
)


class SqliteObjects:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends

    def _object_file(self, tenant: str, sid: int, object_id: str) -> Path:
        return self._db.path.parent / "objects" / tenant / str(sid) / object_id

    # --- the deletion outbox (migration 0007) ---------------------------------
    # Object bytes are files: the rows that delete objects queue their files
    # in the same transaction, and the files go after the commit.

    def queue_deletions(self, conn: sqlite3.Connection, objects: list[tuple[str, int, str]]) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO object_deletions VALUES (?, ?, ?, ?)",
            [(tenant, sid, object_id, self._db.now_ms()) for tenant, sid, object_id in objects],
        )

    def drain_deletions(self) -> int:
        """Delete the queued files, then their rows (writer thread)."""
        conn = self._db.writer
        queued = conn.execute("SELECT tenant_id, sid, object_id FROM object_deletions").fetchall()
        for tenant, sid, object_id in queued:
            target = self._object_file(tenant, sid, object_id)
            target.unlink(missing_ok=True)
            target.with_suffix(".part").unlink(missing_ok=True)
            with suppress(OSError):
                target.parent.rmdir()  # only when empty
            with self._db.transaction() as conn:
                conn.execute(
                    "DELETE FROM object_deletions WHERE tenant_id=? AND sid=? AND object_id=?",
                    (tenant, sid, object_id),
                )
        return len(queued)

    async def pending_deletions(self) -> int:
        """Object files queued for deletion and not deleted yet."""
        return await self._db.read(
            lambda: self._db.reader().execute("SELECT count(*) FROM object_deletions").fetchone()[0]
        )

    def _object_row(self, conn: sqlite3.Connection, tenant: str, path: str, object_id: str) -> Any:
        return conn.execute(OBJECT_SELECT, (tenant, path, object_id)).fetchone()

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        def run() -> ObjectInfo:
            with self._db.transaction() as conn:
                s, _ = self._appends.ensure_stream(conn, tenant, path, new_stream_id, now)
                if s["closed"]:
                    row = conn.execute(
                        f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=? AND sid=? AND idempotency_key=?",
                        (tenant, s["sid"], key),
                    ).fetchone()
                    if row is None:  # a closed stream takes no new object; a retry finds its own
                        raise errors.StreamClosed(f"stream {path} is closed", path=path)
                    return object_from_row(path, row)
                conn.execute(
                    "INSERT INTO objects (tenant_id, sid, object_id, idempotency_key, sha256, size,"
                    " content_type, state, created_at, expires_at, schema_ref, auth_receipt)"
                    " VALUES (?,?,?,?,?,?,?, 'prepared', ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (tenant, s["sid"], object_id, key, sha256, size, content_type, now, expires_at, schema,
                     None if authorization is None else orjson.dumps(authorization).decode()),
                )
                row = conn.execute(
                    f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=? AND sid=? AND idempotency_key=?",
                    (tenant, s["sid"], key),
                ).fetchone()
            return object_from_row(path, row)

        return await self._db.write(run)

    async def upload_object(self, tenant: str, path: str, object_id: str, data: bytes) -> ObjectInfo:
        def run() -> ObjectInfo:
            conn = self._db.writer
            row = self._object_row(conn, tenant, path, object_id)
            if row is None:
                raise errors.ObjectNotFound(f"no object {object_id}", object_id=object_id)
            info = object_from_row(path, row)
            if row["closed"] and info.state != "committed":
                raise errors.StreamClosed(f"stream {path} is closed", path=path)
            if info.state in ("uploaded", "committed"):
                return info  # a retried upload of the same bytes
            if info.state != "prepared":
                raise errors.ObjectStateConflict(f"object {object_id} is {info.state}", state=info.state)
            check_object_bytes(info, data)
            target = self._object_file(tenant, row["sid"], object_id)
            private_dir(target.parent)
            partial = target.with_suffix(".part")
            with open_private(partial) as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
            with self._db.transaction() as conn:
                conn.execute(
                    "UPDATE objects SET state='uploaded' WHERE tenant_id=? AND sid=? AND object_id=?"
                    " AND state='prepared'",
                    (tenant, row["sid"], object_id),
                )
            return replace(info, state="uploaded")

        return await self._db.write(run)

    @retry_reads
    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        def run() -> ObjectInfo | None:
            row = self._object_row(self._db.reader(), tenant, path, object_id)
            return object_from_row(path, row) if row else None

        return await self._db.read(run)

    @retry_reads
    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        def run() -> bytes | None:
            row = self._object_row(self._db.reader(), tenant, path, object_id)
            if row is None or row["state"] != "committed":
                return None
            return self._object_file(tenant, row["sid"], object_id).read_bytes()

        return await self._db.read(run)

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        def run() -> ObjectInfo | None:
            with self._db.transaction() as conn:
                row = self._object_row(conn, tenant, path, object_id)
                if row is None:
                    return None
                info = object_from_row(path, row)
                if info.state == "committed":
                    raise errors.ObjectStateConflict(f"object {object_id} is committed", state="committed")
                conn.execute(
                    "UPDATE objects SET state='aborted' WHERE tenant_id=? AND sid=? AND object_id=?",
                    (tenant, row["sid"], object_id),
                )
            return replace(info, state="aborted")

        return await self._db.write(run)

    async def cleanup_objects(self, now: int) -> int:
        def run() -> int:
            conn = self._db.writer
            doomed = conn.execute(
                "SELECT o.tenant_id, o.sid, o.object_id FROM objects o"
                " JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
                " WHERE s.legal_hold = 0 AND o.state != 'committed'"
                " AND (o.state = 'aborted' OR o.expires_at < ?)",
                (now,),
            ).fetchall()
            self.drain_deletions()  # what a crash left queued
            for tenant, sid, object_id in doomed:
                with self._db.transaction() as conn:
                    gone = conn.execute(
                        "DELETE FROM objects WHERE tenant_id=? AND sid=? AND object_id=?"
                        " AND state != 'committed'",
                        (tenant, sid, object_id),
                    ).rowcount
                    if gone:
                        self.queue_deletions(conn, [(tenant, sid, object_id)])
            self.drain_deletions()
            return len(doomed)

        return await self._db.write(run)
