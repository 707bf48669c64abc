"""PostgreSQL implementation of the Durable Streams storage contract
(``store.protocol``): each unit is one tenant transaction that locks the
stream row first, as ``yoke_append`` does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ... import errors
from ...events import PreparedEvent
from ..results import CommitResult, StreamSettings
from ..durable_streams import NATIVE_CONTENT_TYPE, CreateSpec, Guard, GuardBook, ProtocolStream, assemble, decide_batches
from ..durable_stream_forks import check_fork, sub_offset_prefix
from .appends import APPEND, append_args, commit_result
from .connection import BULK_TIMEOUT_S
from ..rows import PROTOCOL_FORK_COPY, PROTOCOL_STREAM_SELECT, protocol_stream_from_row

if TYPE_CHECKING:
    from .appends import PgAppends
    from .connection import PgDb

BY_PATH = PROTOCOL_STREAM_SELECT + " WHERE s.tenant_id=$1 AND s.path=$2"


class PgProtocolStore:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends

    async def stream(self, tenant: str, path: str) -> ProtocolStream | None:
        # One statement (the function sets the tenant): every protocol request starts here.
        row = await self._db.fetchrow("SELECT * FROM yoke_protocol_stream($1, $2)", tenant, path)
        return protocol_stream_from_row(row) if row else None

    async def touch(self, tenant: str, sid: int, now: int) -> None:
        async with self._db.tx(tenant) as conn:
            await conn.execute(
                "UPDATE protocol_streams SET touched_ms=greatest(touched_ms, $3) WHERE tenant_id=$1 AND sid=$2",
                tenant, sid, now,
            )

    async def forks(self, tenant: str, path: str) -> int:
        async with self._db.tx(tenant) as conn:
            return await conn.fetchval(
                "SELECT count(*) FROM protocol_streams WHERE tenant_id=$1 AND fork_of=$2", tenant, path
            )

    async def soft_delete(self, tenant: str, sid: int, now: int) -> None:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(
                "SELECT path, legal_hold FROM streams WHERE tenant_id=$1 AND sid=$2 FOR UPDATE", tenant, sid
            )
            if row is None:
                return  # deleted meanwhile
            if row["legal_hold"]:
                raise errors.LegalHold(f"stream {row['path']} is under legal hold", path=row["path"])
            # A stream made through Yoke's own API has no protocol row yet.
            await conn.execute(
                "INSERT INTO protocol_streams (tenant_id, sid, content_type, touched_ms, deleted)"
                " VALUES ($1, $2, $3, $4, true) ON CONFLICT (tenant_id, sid) DO UPDATE SET deleted=true",
                tenant, sid, NATIVE_CONTENT_TYPE, now,
            )

    async def create(
        self, tenant: str, path: str, stream_id: str, now: int, spec: CreateSpec
    ) -> tuple[ProtocolStream, bool]:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(BY_PATH + " FOR UPDATE OF s", tenant, path)
            if row is not None:
                return protocol_stream_from_row(row), False
            content_type, ttl_s, expires_at, expires_ms = (
                spec.content_type, spec.ttl_s, spec.expires_at, spec.expires_ms
            )
            source: ProtocolStream | None = None
            prefix: PreparedEvent | None = None
            through = base = 0
            if spec.fork_of is not None:
                srow = await conn.fetchrow(BY_PATH + " FOR SHARE OF s", tenant, spec.fork_of)
                source = protocol_stream_from_row(srow) if srow else None
                source, through, content_type, ttl_s, expires_at, expires_ms = check_fork(source, spec, now)
                base = through
                if spec.fork_sub:
                    nxt = await conn.fetchrow(
                        "SELECT type, data FROM events WHERE tenant_id=$1 AND sid=$2 AND seq=$3",
                        tenant, source.sid, through + 1,
                    )
                    through, prefix = sub_offset_prefix(source, through, spec.fork_sub, nxt)
            if not await self._appends.ensure_stream(conn, tenant, path, stream_id, now, StreamSettings()):
                raise errors.Unavailable("the stream was created meanwhile; retry", reason="conflict")
            sid = await conn.fetchval("SELECT sid FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path)
            await conn.execute(
                "INSERT INTO protocol_streams (tenant_id, sid, content_type, ttl_s, expires_at, expires_ms,"
                " touched_ms, fork_of, fork_offset, fork_sub) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
                tenant, sid, content_type, ttl_s, expires_at, expires_ms, now, spec.fork_of,
                None if source is None else base, spec.fork_sub,
            )
            if source is not None and through:
                await conn.execute(
                    PROTOCOL_FORK_COPY.format(new="$2", tenant="$1", source="$3", through="$4"),
                    tenant, sid, source.sid, through, timeout=BULK_TIMEOUT_S,
                )
                await conn.execute(
                    "UPDATE streams s SET head=$3, durable_events=c.n, durable_bytes=c.b"
                    " FROM (SELECT count(*) AS n, coalesce(sum(size), 0) AS b FROM events"
                    "       WHERE tenant_id=$1 AND sid=$2) c WHERE s.tenant_id=$1 AND s.sid=$2",
                    tenant, sid, through,
                )
            events = ([prefix] if prefix is not None else []) + list(spec.events)
            if events:
                await conn.fetch(APPEND, *append_args(tenant, path, events, [0] * len(events), now, stream_id))
            if spec.closed:
                await conn.execute("UPDATE streams SET closed=true WHERE tenant_id=$1 AND sid=$2", tenant, sid)
            row = await conn.fetchrow(BY_PATH, tenant, path)
        return protocol_stream_from_row(row), True

    async def commit_guarded(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], batch_of: Sequence[int], now: int,
        new_stream_id: str, guards: Sequence[Guard | None],
    ) -> CommitResult:
        async with self._db.tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT sid, stream_id, closed FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if s is None:
                raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
            sid = s["sid"]
            p = await conn.fetchrow(
                "SELECT stream_seq, closed_by, deleted FROM protocol_streams WHERE tenant_id=$1 AND sid=$2",
                tenant, sid,
            )
            ids = sorted({g.producer[0] for g in guards if g is not None and g.producer is not None})
            producers: dict[str, tuple[int, int]] = {}
            if ids:
                for r in await conn.fetch(
                    "SELECT producer_id, epoch, seq FROM protocol_producers"
                    " WHERE tenant_id=$1 AND sid=$2 AND producer_id = ANY($3::text[])",
                    tenant, sid, ids,
                ):
                    producers[r[0]] = (r[1], r[2])
            book = GuardBook(
                closed=s["closed"], closed_by=p["closed_by"] if p else None,
                stream_seq=p["stream_seq"] if p else None, producers=producers,
                stream_id=s["stream_id"], deleted=bool(p and p["deleted"]),
            )
            decided, admitted, admitted_batch = decide_batches(book, events, batch_of, guards)
            if admitted:
                rows = await conn.fetch(
                    APPEND, *append_args(tenant, path, admitted, admitted_batch, now, new_stream_id)
                )
                result = commit_result(rows, admitted)
            else:
                head = await conn.fetchval("SELECT head FROM streams WHERE tenant_id=$1 AND sid=$2", tenant, sid)
                result = CommitResult(outcomes=[], head=head)
            if book.changed:
                await conn.executemany(
                    "INSERT INTO protocol_producers VALUES ($1,$2,$3,$4,$5,$6)"
                    " ON CONFLICT (tenant_id, sid, producer_id) DO UPDATE SET epoch=excluded.epoch,"
                    " seq=excluded.seq, updated_ms=excluded.updated_ms",
                    [(tenant, sid, pid, epoch, seq, now) for pid, (epoch, seq) in book.changed.items()],
                )
            if book.stream_changed:
                await conn.execute(
                    "INSERT INTO protocol_streams (tenant_id, sid, content_type, touched_ms)"
                    " VALUES ($1, $2, 'application/json', $3) ON CONFLICT DO NOTHING", tenant, sid, now,
                )
                await conn.execute(
                    "UPDATE protocol_streams SET stream_seq=$3, closed_by=$4 WHERE tenant_id=$1 AND sid=$2",
                    tenant, sid, book.stream_seq, book.closed_by,
                )
                if book.closed and not s["closed"]:
                    await conn.execute("UPDATE streams SET closed=true WHERE tenant_id=$1 AND sid=$2", tenant, sid)
        return assemble(events, batch_of, decided, result, result.head, now)
