"""The input delivery outbox on SQLite (``store.outbox``: see ``store/outbox.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...events import PreparedEvent
from ..results import CommitResult
from ..faults import retry_reads
from ..outbox import Delivery

if TYPE_CHECKING:
    from .appends import SqliteAppends
    from .connection import SqliteDb


class SqliteOutboxStore:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends

    async def append_input(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], now: int, new_stream_id: str,
        wake_path: str,
    ) -> CommitResult:

        def run() -> CommitResult:
            with self._db.transaction() as conn:
                result = self._appends.commit_in(conn, tenant, path, events, [0] * len(events), now, new_stream_id)
                row = self._appends.stream_row(conn, tenant, path)
                conn.executemany(
                    "INSERT INTO input_outbox (tenant_id, sid, seq, record_id, wake_path, created_at, next_at)"
                    " VALUES (?,?,?,?,?,?,?)",
                    [(tenant, row["sid"], o.offset, o.id, wake_path, now, now)
                     for o in result.outcomes if o.status == "ok"],
                )
                return result

        return await self._db.write(run)

    @retry_reads
    async def due(self, now: int, limit: int) -> list[Delivery]:
        rows = await self._db.read(lambda: self._db.reader().execute(
            "SELECT o.tenant_id, s.path, s.stream_id, o.seq, o.record_id, o.wake_path, o.attempts"
            " FROM input_outbox o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
            " WHERE o.next_at <= ? ORDER BY o.next_at, o.seq LIMIT ?", (now, limit),
        ).fetchall())
        return [Delivery(*r) for r in rows]

    async def done(self, tenant: str, path: str, offset: int) -> None:
        await self._change(
            "DELETE FROM input_outbox WHERE tenant_id = ? AND seq = ?"
            " AND sid = (SELECT sid FROM streams WHERE tenant_id = ? AND path = ?)",
            (tenant, offset, tenant, path),
        )

    async def retry(self, tenant: str, path: str, offset: int, next_at: int, error: str) -> None:
        await self._change(
            "UPDATE input_outbox SET attempts = attempts + 1, next_at = ?, error = ? WHERE tenant_id = ?"
            " AND seq = ? AND sid = (SELECT sid FROM streams WHERE tenant_id = ? AND path = ?)",
            (next_at, error[:1000], tenant, offset, tenant, path),
        )

    async def _change(self, sql: str, params: tuple[object, ...]) -> None:

        def run() -> None:
            with self._db.transaction() as conn:
                conn.execute(sql, params)

        await self._db.write(run)
