"""Consumers on SQLite: named acknowledgement positions on a stream, moved
under the stream's write lock, with the stream's unread counters (producer
credit) kept exact."""

from __future__ import annotations

import sqlite3

from ... import errors
from ..faults import retry_reads
from ..results import ConsumerInfo
from ..rules import check_ack, unread_recount
from ..rows import consumer_from_row
from . import event_blocks
from .appends import SqliteAppends
from .connection import SqliteDb


class SqliteConsumers:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        def run() -> ConsumerInfo:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None:
                    raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
                sid = s["sid"]
                row = conn.execute(
                    "SELECT acked, created_at FROM consumers WHERE tenant_id=? AND sid=? AND consumer_id=?",
                    (tenant, sid, consumer_id),
                ).fetchone()
                check_ack(consumer_id, offset, s["head"], None if row is None else row[0])
                created = row[1] if row is not None else now
                conn.execute(
                    "INSERT INTO consumers (tenant_id, sid, consumer_id, acked, created_at, updated_at)"
                    " VALUES (?,?,?,?,?,?) ON CONFLICT (tenant_id, sid, consumer_id)"
                    " DO UPDATE SET acked=excluded.acked, updated_at=excluded.updated_at",
                    (tenant, sid, consumer_id, offset, created, now),
                )
                self._recount_unread(conn, tenant, s)
            return ConsumerInfo(consumer_id, offset, created, now)

        return await self._db.write(run)

    def _recount_unread(self, conn: sqlite3.Connection, tenant: str, s: sqlite3.Row) -> None:
        """After consumers changed: move min_ack and keep the unread counters exact."""
        sid, old = s["sid"], s["min_ack"]
        new = conn.execute(
            "SELECT min(acked) FROM consumers WHERE tenant_id=? AND sid=?", (tenant, sid)
        ).fetchone()[0]
        recount = unread_recount(old, new)
        if recount == "same":
            return
        if recount == "none":
            events = size = 0
        elif recount == "advance":
            n, b = conn.execute(
                f"SELECT count(*), coalesce(sum(size), 0) FROM ({event_blocks.span('size', bounded=True)})",
                {"t": tenant, "s": sid, "after": old, "hi": new},
            ).fetchone()
            events, size = s["unread_events"] - n, s["unread_bytes"] - b
        else:
            events, size = conn.execute(
                f"SELECT count(*), coalesce(sum(size), 0) FROM ({event_blocks.span('size')})",
                {"t": tenant, "s": sid, "after": new},
            ).fetchone()
        conn.execute(
            "UPDATE streams SET min_ack=?, unread_events=?, unread_bytes=? WHERE tenant_id=? AND sid=?",
            (new, events, size, tenant, sid),
        )

    @retry_reads
    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]:
        def run() -> list[ConsumerInfo]:
            rows = self._db.reader().execute(
                "SELECT c.consumer_id, c.acked, c.created_at, c.updated_at FROM consumers c"
                " JOIN streams s ON s.tenant_id = c.tenant_id AND s.sid = c.sid"
                " WHERE s.tenant_id=? AND s.path=? ORDER BY c.consumer_id",
                (tenant, path),
            ).fetchall()
            return [consumer_from_row(r) for r in rows]

        return await self._db.read(run)

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool:
        def run() -> bool:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None:
                    return False
                cur = conn.execute(
                    "DELETE FROM consumers WHERE tenant_id=? AND sid=? AND consumer_id=?",
                    (tenant, s["sid"], consumer_id),
                )
                if cur.rowcount:
                    self._recount_unread(conn, tenant, s)
                return cur.rowcount > 0

        return await self._db.write(run)
