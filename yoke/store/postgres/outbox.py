"""The input delivery outbox on PostgreSQL (``store.outbox``: see ``store/outbox.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...events import PreparedEvent
from ..results import CommitResult
from ..faults import retry_reads
from ..outbox import Delivery

if TYPE_CHECKING:
    from .appends import PgAppends
    from .connection import PgDb


class PgOutboxStore:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends

    async def append_input(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], now: int, new_stream_id: str,
        wake_path: str,
    ) -> CommitResult:
        async with self._db.tx(tenant) as conn:
            result = await self._appends.commit_batch(conn, tenant, path, events, now, new_stream_id)
            new = [(o.offset, o.id) for o in result.outcomes if o.status == "ok"]
            if new:
                await conn.execute(
                    "INSERT INTO input_outbox (tenant_id, sid, seq, record_id, wake_path, created_at, next_at)"
                    " SELECT $1, s.sid, u.seq, u.id, $3, $4, $4"
                    " FROM streams s, unnest($5::bigint[], $6::text[]) AS u(seq, id)"
                    " WHERE s.tenant_id = $1 AND s.path = $2",
                    tenant, path, wake_path, now, [n[0] for n in new], [n[1] for n in new],
                )
        return result

    @retry_reads
    async def due(self, now: int, limit: int) -> list[Delivery]:
        found: list[Delivery] = []
        for tenant in await self._appends.tenants():
            async with self._db.tx(tenant) as conn:
                rows = await conn.fetch(
                    "SELECT s.path, s.stream_id, o.seq, o.record_id, o.wake_path, o.attempts"
                    " FROM input_outbox o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
                    " WHERE o.tenant_id = $1 AND o.next_at <= $2 ORDER BY o.next_at, o.seq LIMIT $3",
                    tenant, now, limit - len(found),
                )
            found.extend(Delivery(tenant, *r) for r in rows)
            if len(found) >= limit:
                break
        return found

    async def done(self, tenant: str, path: str, offset: int) -> None:
        async with self._db.tx(tenant) as conn:
            await conn.execute(
                "DELETE FROM input_outbox o USING streams s WHERE o.tenant_id = $1 AND s.tenant_id = o.tenant_id"
                " AND s.sid = o.sid AND s.path = $2 AND o.seq = $3",
                tenant, path, offset,
            )

    async def retry(self, tenant: str, path: str, offset: int, next_at: int, error: str) -> None:
        async with self._db.tx(tenant) as conn:
            await conn.execute(
                "UPDATE input_outbox o SET attempts = o.attempts + 1, next_at = $4, error = $5 FROM streams s"
                " WHERE o.tenant_id = $1 AND s.tenant_id = o.tenant_id AND s.sid = o.sid AND s.path = $2"
                " AND o.seq = $3",
                tenant, path, offset, next_at, error[:1000],
            )
