"""Streams on PostgreSQL: create, settings, delete, retention, stream info
and listing, lifecycle facts, gap evidence."""

from __future__ import annotations

import logging

from ... import errors
from ...events import PreparedEvent
from ...lifecycle import STREAM_DELETED, new_stream_id, stream_fact
from ..faults import log_retried, retry_reads
from ..results import (
    MAX_GAPS,
    GapEvidence,
    Limits,
    Outcome,
    Retention,
    StreamInfo,
    StreamSettings,
    StreamTotals,
)
from ..rows import STREAM_COLUMNS, like_prefix, setting_changes, stream_from_row
from ..rules import age_cutoff, prune_through, unread_floor
from .appends import PgAppends
from .connection import BULK_TIMEOUT_S, PgDb

log = logging.getLogger("yoke.store.postgres")


class PgStreams:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        async with self._db.tx(tenant) as conn:
            result = await self._appends.commit_batch(conn, tenant, "/", [event], now, new_stream_id, kernel=True)
        return result.outcomes[0]

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        async with self._db.tx(tenant) as conn:
            created = await self._appends.ensure_stream(conn, tenant, path, stream_id, now, settings)
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row), created

    async def update_stream(
        self,
        tenant: str,
        path: str,
        *,
        closed: bool | None = None,
        legal_hold: bool | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
    ) -> StreamInfo | None:
        columns, values = setting_changes(closed, legal_hold, retention, limits)
        async with self._db.tx(tenant) as conn:
            pinned = await conn.fetchval(
                "SELECT pinned FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if pinned is None:
                return None
            if pinned and (retention is not None or limits is not None):
                raise errors.StreamPinned(f"stream {path} is a pinned definition", path=path)
            if columns:
                assignments = ", ".join(f"{c}=${i + 3}" for i, c in enumerate(columns))
                await conn.execute(
                    f"UPDATE streams SET {assignments} WHERE tenant_id=$1 AND path=$2",
                    tenant, path, *values,
                )
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row)

    async def delete_stream(self, tenant: str, path: str) -> StreamInfo | None:
        async with self._db.tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT sid, legal_hold FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE",
                tenant, path,
            )
            if s is None:
                return None
            if s["legal_hold"]:
                raise errors.LegalHold(f"stream {path} is under legal hold", path=path)
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND sid=$2", tenant, s["sid"]
            )
            # Object bytes are a column of their rows: they go with them.
            for table in ("events", "consumers", "objects", "fanout_cursors", "input_outbox", "gap_evidence",
                          "protocol_streams", "protocol_producers"):
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id=$1 AND sid=$2", tenant, s["sid"],
                                   timeout=BULK_TIMEOUT_S)
            for table in ("subscriptions", "processor_checkpoints", "subscription_inbound", "subscription_catalogues"):
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id=$1 AND path=$2", tenant, path,
                                   timeout=BULK_TIMEOUT_S)
            await conn.execute("DELETE FROM streams WHERE tenant_id=$1 AND sid=$2", tenant, s["sid"])
            if path != "/":  # (the global stream is never deleted)
                fact = stream_fact(STREAM_DELETED, path, row["stream_id"])
                now = self._db.now_ms()
                await self._appends.commit_batch(conn, tenant, "/", [fact], now, new_stream_id(), kernel=True)
            # Tails in other processes read again and see it gone (at commit).
            await conn.execute("SELECT pg_notify('yoke_stream', $1)", f"{tenant}|{path}")
        return stream_from_row(row)

    async def prune(self, now: int) -> int:
        removed = 0
        for tenant in await self._appends.tenants():
            async with self._db.tx(tenant) as conn:
                candidates = await conn.fetch(
                    "SELECT sid FROM streams WHERE tenant_id=$1 AND NOT legal_hold"
                    " AND (max_age_s IS NOT NULL OR max_events IS NOT NULL)",
                    tenant,
                )
            for (sid,) in candidates:
                try:
                    removed += await self._prune_stream(tenant, sid, now)
                except Exception:  # one bad stream must not stop the pass
                    log_retried(log, "pruning %s stream %s failed", tenant, sid)
        return removed

    async def _prune_stream(self, tenant: str, sid: int, now: int) -> int:
        async with self._db.tx(tenant) as conn:
            # Lock the stream row: a legal hold set meanwhile wins, and the
            # credit counters change with the rows.
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND sid=$2 FOR UPDATE", tenant, sid
            )
            if s is None or s["legal_hold"]:
                return 0
            by_count = by_age = None
            if s["max_events"] is not None:
                by_count = await conn.fetchval(
                    "SELECT seq FROM events WHERE tenant_id=$1 AND sid=$2"
                    " ORDER BY seq DESC LIMIT 1 OFFSET $3",
                    tenant, sid, s["max_events"],
                )
            if s["max_age_s"] is not None:
                by_age = await conn.fetchval(
                    "SELECT max(seq) FROM events WHERE tenant_id=$1 AND sid=$2 AND at < $3",
                    tenant, sid, age_cutoff(now, s["max_age_s"]),
                )
            threshold = prune_through(s["pruned_through"], by_count, by_age)
            if threshold is None:
                return 0
            min_ack = unread_floor(s["min_ack"], threshold)
            n, size, n_unread, size_unread = await conn.fetchrow(
                "WITH gone AS (DELETE FROM events WHERE tenant_id=$1 AND sid=$2 AND seq <= $3"
                " RETURNING seq, size)"
                " SELECT count(*), coalesce(sum(size), 0), count(*) FILTER (WHERE seq > $4),"
                " coalesce(sum(size) FILTER (WHERE seq > $4), 0) FROM gone",
                tenant, sid, threshold, min_ack, timeout=BULK_TIMEOUT_S,
            )
            await conn.execute(
                "UPDATE streams SET pruned_through=$3, durable_events=durable_events-$4,"
                " durable_bytes=durable_bytes-$5, unread_events=unread_events-$6,"
                " unread_bytes=unread_bytes-$7 WHERE tenant_id=$1 AND sid=$2",
                tenant, sid, threshold, n, size, n_unread, size_unread,
            )
        return n

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        async with self._db.tx(tenant) as conn:
            sid = await conn.fetchval("SELECT sid FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path)
            if sid is None:
                return
            await conn.execute(
                "INSERT INTO gap_evidence VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING",
                tenant, sid, at, first, last, cause, process,
            )
            await conn.execute(
                "DELETE FROM gap_evidence WHERE tenant_id=$1 AND sid=$2 AND detected_at < ("
                " SELECT detected_at FROM gap_evidence WHERE tenant_id=$1 AND sid=$2"
                " ORDER BY detected_at DESC OFFSET $3 LIMIT 1)",
                tenant, sid, MAX_GAPS - 1,
            )

    @retry_reads
    async def gaps(self, tenant: str, path: str, limit: int) -> list[GapEvidence]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT g.first_seq, g.last_seq, g.cause, g.detected_at, g.process FROM gap_evidence g"
                " JOIN streams s ON s.tenant_id = g.tenant_id AND s.sid = g.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 ORDER BY g.detected_at DESC, g.first_seq DESC LIMIT $3",
                tenant, path, limit,
            )
        return [GapEvidence(*r) for r in rows]

    @retry_reads
    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row) if row else None

    @retry_reads
    async def stream_totals(self, tenant: str) -> StreamTotals:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(head), 0)::bigint FROM streams WHERE tenant_id=$1", tenant
            )
        return StreamTotals(row[0], row[1])

    @retry_reads
    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1"
                " AND path LIKE $2 AND path > $3 ORDER BY path LIMIT $4",
                tenant, like_prefix(prefix), after_path or "", limit,
            )
        return [stream_from_row(r) for r in rows]
