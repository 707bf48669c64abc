"""The input delivery outbox on SQLite (``store.outbox``: see ``store/outbox.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...events import PreparedEvent
from ..contract import CommitResult
from ..faults import retry_reads
from ..outbox import Delivery

if TYPE_CHECKING:
    from .store import SqliteStore


class SqliteOutboxStore:
    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def append_input(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], now: int, new_stream_id: str,
        wake_path: str,
    ) -> CommitResult:
        store = self._store

        def run() -> CommitResult:
            with store._transaction() as conn:
                result = store._commit_in(conn, tenant, path, events, [0] * len(events), now, new_stream_id)
                row = store._stream_row(conn, tenant, path)
                conn.executemany(
                    "INSERT INTO input_outbox (tenant_id, sid, seq, record_id, wake_path, created_at, next_at)"
                    " VALUES (?,?,?,?,?,?,?)",
                    [(tenant, row["sid"], o.offset, o.id, wake_path, now, now)
                     for o in result.outcomes if o.status == "ok"],
                )
                return result

        return await store._write(run)

    @retry_reads
    async def due(self, now: int, limit: int) -> list[Delivery]:
        store = self._store
        rows = await store._read(lambda: store._rconn().execute(
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
        store = self._store

        def run() -> None:
            with store._transaction() as conn:
                conn.execute(sql, params)

        await store._write(run)
