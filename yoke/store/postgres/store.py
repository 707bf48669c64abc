"""Server backend: PostgreSQL through asyncpg.

Every query runs as the ``yoke_runtime`` role (no BYPASSRLS) with the tenant
set per transaction, so row-level security isolates tenants whatever the
query. The hot paths (group commit, reads) are single round trips into the
SQL functions defined in the migrations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from ...events import PreparedEvent
from ..contract import CommitResult, Outcome, ReadPage, Retention, StreamInfo, WakeupCallback
from ..rows import STREAM_COLUMNS, event_from_row, like_prefix, stream_from_row
from .listener import Listener
from .migrate import migrate

MAX_OFFSET = 2**63 - 1


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Pool release hook. The default one costs a round trip per use to reset
    session state; Yoke keeps none (the tenant setting is transaction-local,
    and asyncpg still rolls back any open transaction itself)."""


class PostgresStore:
    def __init__(self, dsn: str, *, role: str = "yoke_runtime", pool_min: int = 2, pool_max: int = 10) -> None:
        self.dsn = dsn
        self.role = role
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._pool: asyncpg.Pool | None = None
        self.listener: Listener | None = None

    # --- lifecycle ----------------------------------------------------------

    async def start(self, on_wakeup: WakeupCallback, on_resync: Callable[[], None]) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await migrate(conn)
            privileged = await conn.fetchval(
                "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
            )
        finally:
            await conn.close()
        role = self.role if privileged else None

        async def init(c: asyncpg.Connection) -> None:
            # A privileged login would bypass RLS: work through the runtime
            # role instead. (RESET ALL on pool release keeps the role.)
            if role is not None:
                await c.execute(f'SET ROLE "{role}"')

        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=self._pool_min,
            max_size=self._pool_max,
            init=init,
            reset=_keep_session,
        )
        self.listener = Listener(self.dsn, on_wakeup, on_resync)
        await self.listener.start()

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "store not started"
        return self._pool

    @asynccontextmanager
    async def _tx(self, tenant: str) -> AsyncIterator[asyncpg.Connection]:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
            yield conn

    # --- writes --------------------------------------------------------------

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
    ) -> CommitResult:
        rows = await self.pool.fetch(
            "SELECT * FROM yoke_append($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)",
            tenant,
            path,
            new_stream_id,
            now,
            list(batch_of),
            [e.id for e in events],
            [e.type for e in events],
            [e.payload_json for e in events],
            [e.metadata_json for e in events],
            [e.source_json for e in events],
            [e.correlation for e in events],
            [e.priority for e in events],
            [e.group_id for e in events],
            [e.idempotency_key for e in events],
            [e.fingerprint for e in events],
            [e.size for e in events],
            [e.ephemeral for e in events],
        )
        status, first, _, at, head = rows[0]
        if status == "closed":
            return CommitResult(closed=True, outcomes=[], head=head)
        if all(e.idempotency_key is None for e in events):
            # The keyless fast path: consecutive offsets from ``first``.
            outcomes = [Outcome("ok", first + i, e.id, at) for i, e in enumerate(events)]
        else:
            outcomes = [Outcome(r[0], r[1], r[2], r[3]) for r in rows]
        return CommitResult(closed=False, outcomes=outcomes, head=head)

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, retention: Retention
    ) -> tuple[StreamInfo, bool]:
        async with self._tx(tenant) as conn:
            await conn.execute(
                "INSERT INTO yoke_tenants VALUES ($1, $2) ON CONFLICT DO NOTHING", tenant, now
            )
            created = await conn.fetchval(
                "INSERT INTO streams (tenant_id, path, stream_id, created_at, max_age_s, max_events)"
                " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT DO NOTHING RETURNING true",
                tenant, path, stream_id, now, retention.max_age_s, retention.max_events,
            )
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row), bool(created)

    async def update_stream(
        self,
        tenant: str,
        path: str,
        *,
        closed: bool | None = None,
        legal_hold: bool | None = None,
        retention: Retention | None = None,
    ) -> StreamInfo | None:
        sets: list[str] = []
        params: list[Any] = [tenant, path]
        if closed is not None:
            params.append(closed)
            sets.append(f"closed=${len(params)}")
        if legal_hold is not None:
            params.append(legal_hold)
            sets.append(f"legal_hold=${len(params)}")
        if retention is not None:
            params += [retention.max_age_s, retention.max_events]
            sets += [f"max_age_s=${len(params) - 1}", f"max_events=${len(params)}"]
        async with self._tx(tenant) as conn:
            if sets:
                row = await conn.fetchrow(
                    f"UPDATE streams SET {', '.join(sets)} WHERE tenant_id=$1 AND path=$2"
                    f" RETURNING {STREAM_COLUMNS}",
                    *params,
                )
            else:
                row = await conn.fetchrow(
                    f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2",
                    tenant, path,
                )
        return stream_from_row(row) if row else None

    async def prune(self, now: int) -> int:
        removed = 0
        tenants = [r[0] for r in await self.pool.fetch("SELECT tenant_id FROM yoke_tenants")]
        for tenant in tenants:
            async with self._tx(tenant) as conn:
                candidates = await conn.fetch(
                    "SELECT sid FROM streams WHERE tenant_id=$1 AND NOT legal_hold"
                    " AND (max_age_s IS NOT NULL OR max_events IS NOT NULL)",
                    tenant,
                )
            for (sid,) in candidates:
                removed += await self._prune_stream(tenant, sid, now)
        return removed

    async def _prune_stream(self, tenant: str, sid: int, now: int) -> int:
        async with self._tx(tenant) as conn:
            # Lock the stream row: a legal hold set meanwhile wins.
            row = await conn.fetchrow(
                "SELECT pruned_through, legal_hold, max_age_s, max_events FROM streams"
                " WHERE tenant_id=$1 AND sid=$2 FOR UPDATE",
                tenant, sid,
            )
            if row is None or row["legal_hold"]:
                return 0
            threshold = 0
            if row["max_events"] is not None:
                seq = await conn.fetchval(
                    "SELECT seq FROM events WHERE tenant_id=$1 AND sid=$2"
                    " ORDER BY seq DESC LIMIT 1 OFFSET $3",
                    tenant, sid, row["max_events"],
                )
                threshold = max(threshold, seq or 0)
            if row["max_age_s"] is not None:
                cutoff = now - int(row["max_age_s"] * 1000)
                seq = await conn.fetchval(
                    "SELECT max(seq) FROM events WHERE tenant_id=$1 AND sid=$2 AND at < $3",
                    tenant, sid, cutoff,
                )
                threshold = max(threshold, seq or 0)
            if threshold <= row["pruned_through"]:
                return 0
            status = await conn.execute(
                "DELETE FROM events WHERE tenant_id=$1 AND sid=$2 AND seq <= $3",
                tenant, sid, threshold,
            )
            await conn.execute(
                "UPDATE streams SET pruned_through=$3 WHERE tenant_id=$1 AND sid=$2",
                tenant, sid, threshold,
            )
        return int(status.split()[-1])

    # --- reads ---------------------------------------------------------------

    async def read(self, tenant: str, path: str, after: int, limit: int) -> ReadPage:
        return await self._read(tenant, path, after, MAX_OFFSET, limit)

    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        return await self._read(tenant, path, offset - 1, offset, 1)

    async def _read(self, tenant: str, path: str, after: int, upto: int, limit: int) -> ReadPage:
        rows = await self.pool.fetch(
            "SELECT * FROM yoke_read($1, $2, $3, $4, $5)", tenant, path, after, upto, limit
        )
        if not rows:
            return ReadPage(exists=False, head=0, pruned_through=0, events=[])
        head, pruned_through = rows[0][0], rows[0][1]
        events = [event_from_row(tenant, path, r[2:]) for r in rows if r[2] is not None]
        return ReadPage(exists=True, head=head, pruned_through=pruned_through, events=events)

    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row) if row else None

    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1"
                " AND path LIKE $2 AND path > $3 ORDER BY path LIMIT $4",
                tenant, like_prefix(prefix), after_path or "", limit,
            )
        return [stream_from_row(r) for r in rows]
