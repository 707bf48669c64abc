"""The append on PostgreSQL: the arguments of ``yoke_append`` (the steps
of an append, in PL/pgSQL: functions/yoke_append.sql) and its rows made
outcomes; appends inside a caller's transaction (facts, subscription
control events, copies, atomic runs, the outbox); streams created when
missing; the tenants directory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from ...events import PreparedEvent
from ..results import CommitResult, Outcome, StreamSettings
from .connection import PgDb

APPEND = "SELECT * FROM yoke_append($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20)"
# The same, and each admitted ephemeral event's chunks NOTIFYed on the relay
# channel (relay.py, migration 0008).
APPEND_RELAY = (
    "SELECT * FROM yoke_append_relay($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,"
    "$19,$20,$21)"
)
# yoke_append into the lifetime ($21) a protocol append was decided for, or
# no row when the path no longer holds it (migration 0022).
APPEND_IN_LIFETIME = (
    "SELECT * FROM yoke_append_in_lifetime($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,"
    "$19,$20,$21)"
)


def _nullable(values: list[Any]) -> list[Any] | None:
    """A column of nullable values, or NULL when every value is: yoke_append
    reads a NULL array as all NULLs (unnest pads it, a subscript of it is
    NULL), and asyncpg spends about 0.3 us encoding each element."""
    return values if any(v is not None for v in values) else None


def append_args(
    tenant: str, path: str, events: Sequence[PreparedEvent], batch_of: Sequence[int], now: int,
    new_stream_id: str, kernel: bool = False,
) -> tuple[object, ...]:
    return (
        tenant,
        path,
        new_stream_id,
        now,
        list(batch_of),
        [e.id for e in events],
        [e.type for e in events],
        [e.payload_json for e in events],
        [e.metadata_json for e in events],
        _nullable([e.source_json for e in events]),
        _nullable([e.correlation for e in events]),
        [e.priority for e in events],
        _nullable([e.group_id for e in events]),
        _nullable([e.idempotency_key for e in events]),
        _nullable([e.fingerprint for e in events]),
        [e.size for e in events],
        [e.ephemeral for e in events],
        _nullable([e.object_id for e in events]),
        kernel,
        _nullable([e.data for e in events]),
    )


def commit_result(rows: Sequence[asyncpg.Record], events: Sequence[PreparedEvent]) -> CommitResult:
    status, first, _, at, head = rows[0]
    if rows[0][2] is None:
        # The fast path (a single row, no id): consecutive offsets from ``first``.
        outcomes = [Outcome("ok", first + i, e.id, at) for i, e in enumerate(events)]
    else:
        outcomes = [Outcome(r[0], r[1], r[2], r[3]) for r in rows]
    return CommitResult(outcomes=outcomes, head=head)


class PgAppends:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def commit_in(
        self, conn: asyncpg.Connection, tenant: str, path: str, events: Sequence[PreparedEvent],
        now: int, new_stream_id: str,
    ) -> Outcome:
        """Append one caller batch inside the caller's transaction (kernel
        writes that must commit together with rows of their own)."""
        return (await self.commit_batch(conn, tenant, path, events, now, new_stream_id)).outcomes[0]

    async def commit_batch(
        self, conn: asyncpg.Connection, tenant: str, path: str, events: Sequence[PreparedEvent],
        now: int, new_stream_id: str, *, kernel: bool = False,
    ) -> CommitResult:
        """Like ``commit_in``, with every event's outcome. ``kernel``:
        subscription bookkeeping that a closed or full stream still takes."""
        rows = await conn.fetch(
            APPEND, *append_args(tenant, path, events, [0] * len(events), now, new_stream_id, kernel)
        )
        return commit_result(rows, events)

    async def ensure_stream(
        self, conn: asyncpg.Connection, tenant: str, path: str, stream_id: str, now: int,
        settings: StreamSettings | None = None,
    ) -> bool:
        """Create the stream (and its tenant's directory entry) if missing."""
        settings = settings or StreamSettings()
        lim, ret = settings.limits, settings.retention
        await conn.execute("INSERT INTO yoke_tenants VALUES ($1, $2) ON CONFLICT DO NOTHING", tenant, now)
        created = await conn.fetchval(
            "INSERT INTO streams (tenant_id, path, stream_id, created_at, max_age_s, max_events,"
            " max_unread_events, max_unread_bytes, max_total_events, max_total_bytes, overflow,"
            " block_timeout_s, pinned, metadata, data_handling)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14::json,$15::json)"
            " ON CONFLICT DO NOTHING RETURNING true",
            tenant, path, stream_id, now, ret.max_age_s, ret.max_events,
            lim.max_unread_events, lim.max_unread_bytes, lim.max_total_events,
            lim.max_total_bytes, lim.overflow, lim.block_timeout_s, settings.pinned,
            orjson.dumps(settings.metadata).decode(),
            None if settings.data_handling is None else orjson.dumps(settings.data_handling).decode(),
        )
        return bool(created)

    async def tenants(self) -> list[str]:
        return [r[0] for r in await self._db.fetch("SELECT tenant_id FROM yoke_tenants")]
