"""SQLite implementation of the Durable Streams storage contract
(``store.protocol``), on the store's writer thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ... import errors
from ...lifecycle import STREAM_CLOSED, stream_fact
from ...events import PreparedEvent
from ..results import CommitResult, StreamSettings
from ..durable_streams import NATIVE_CONTENT_TYPE, OK, CreateSpec, Guard, GuardBook, ProtocolStream, assemble, decide_batches, one_lifetime
from ..rows import PROTOCOL_STREAM_SELECT, protocol_stream_from_row
from ..durable_stream_forks import check_fork, sub_offset_prefix
from . import event_blocks

if TYPE_CHECKING:
    from .appends import SqliteAppends
    from .connection import SqliteDb

BY_PATH = PROTOCOL_STREAM_SELECT + " WHERE s.tenant_id=? AND s.path=?"
# A guarded commit's stream row, with its protocol settings (p_sid is NULL
# for a stream made through Yoke's own API).
GUARDED_SELECT = (
    "SELECT s.*, p.sid AS p_sid, p.stream_seq AS p_stream_seq, p.closed_by AS p_closed_by,"
    " p.deleted AS p_deleted"
    " FROM streams s LEFT JOIN protocol_streams p ON p.tenant_id = s.tenant_id AND p.sid = s.sid"
    " WHERE s.tenant_id=? AND s.path=?"
)
# What a guard that checks only the lifetime needs: nothing the group holds back.
LIFETIME_SELECT = (
    "SELECT s.stream_id, coalesce(p.deleted, 0) FROM streams s"
    " LEFT JOIN protocol_streams p ON p.tenant_id = s.tenant_id AND p.sid = s.sid"
    " WHERE s.tenant_id=? AND s.path=?"
)


class SqliteProtocolStore:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends

    async def stream(self, tenant: str, path: str) -> ProtocolStream | None:
        def run() -> ProtocolStream | None:
            row = self._db.reader().execute(BY_PATH, (tenant, path)).fetchone()
            return protocol_stream_from_row(row) if row else None

        return await self._db.read(run)

    async def touch(self, tenant: str, sid: int, now: int) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                conn.execute(
                    "UPDATE protocol_streams SET touched_ms=max(touched_ms, ?) WHERE tenant_id=? AND sid=?",
                    (now, tenant, sid),
                )

        # Every request to a stream with a TTL touches it: keep the writer's stream row copies.
        await self._db.write(run, streams_unchanged=True)

    async def forks(self, tenant: str, path: str) -> int:
        def run() -> int:
            return self._db.reader().execute(
                "SELECT count(*) FROM protocol_streams WHERE tenant_id=? AND fork_of=?", (tenant, path)
            ).fetchone()[0]

        return await self._db.read(run)

    async def soft_delete(self, tenant: str, sid: int, now: int) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                row = conn.execute(
                    "SELECT path, legal_hold FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid)
                ).fetchone()
                if row is None:
                    return  # deleted meanwhile
                if row[1]:
                    raise errors.LegalHold(f"stream {row[0]} is under legal hold", path=row[0])
                # A stream made through Yoke's own API has no protocol row yet.
                conn.execute(
                    "INSERT INTO protocol_streams (tenant_id, sid, content_type, touched_ms, deleted)"
                    " VALUES (?, ?, ?, ?, 1) ON CONFLICT (tenant_id, sid) DO UPDATE SET deleted=1",
                    (tenant, sid, NATIVE_CONTENT_TYPE, now),
                )

        await self._db.write(run)

    async def create(
        self, tenant: str, path: str, stream_id: str, now: int, spec: CreateSpec
    ) -> tuple[ProtocolStream, bool]:
        return await self._db.write(self._create, tenant, path, stream_id, now, spec)

    def _create(
        self, tenant: str, path: str, stream_id: str, now: int, spec: CreateSpec
    ) -> tuple[ProtocolStream, bool]:
        with self._db.transaction() as conn:
            row = conn.execute(BY_PATH, (tenant, path)).fetchone()
            if row is not None:
                return protocol_stream_from_row(row), False
            content_type, ttl_s, expires_at, expires_ms = (
                spec.content_type, spec.ttl_s, spec.expires_at, spec.expires_ms
            )
            source: ProtocolStream | None = None
            prefix: PreparedEvent | None = None
            through = base = 0
            if spec.fork_of is not None:
                srow = conn.execute(BY_PATH, (tenant, spec.fork_of)).fetchone()
                source = protocol_stream_from_row(srow) if srow else None
                source, through, content_type, ttl_s, expires_at, expires_ms = check_fork(source, spec, now)
                base = through
                if spec.fork_sub:
                    nxt = conn.execute(
                        event_blocks.span("type, data", bounded=True),
                        {"t": tenant, "s": source.sid, "after": through, "hi": through + 1},
                    ).fetchone()
                    through, prefix = sub_offset_prefix(source, through, spec.fork_sub, nxt)
            s, _ = self._appends.ensure_stream(conn, tenant, path, stream_id, now, StreamSettings())
            sid = s["sid"]
            conn.execute(
                "INSERT INTO protocol_streams (tenant_id, sid, content_type, ttl_s, expires_at, expires_ms,"
                " touched_ms, fork_of, fork_offset, fork_sub) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (tenant, sid, content_type, ttl_s, expires_at, expires_ms, now, spec.fork_of,
                 None if source is None else base, spec.fork_sub),
            )
            if source is not None and through:
                base = conn.execute(event_blocks.LAST_ROW_ID).fetchone()[0]
                conn.execute(event_blocks.FORK_COPY, {"t": tenant, "s": source.sid, "after": 0, "hi": through, "new": sid})
                conn.execute(event_blocks.BLOCKS_OF_NEW_ROWS, {"base": base})
                conn.execute(
                    "UPDATE streams SET head=:hi, (durable_events, durable_bytes)"
                    " = (SELECT count(*), coalesce(sum(size), 0) FROM event_rows WHERE row_id > :base)"
                    " WHERE tenant_id=:t AND sid=:new",
                    {"t": tenant, "new": sid, "hi": through, "base": base},
                )
            events = ([prefix] if prefix is not None else []) + list(spec.events)
            if events:
                self._appends.commit_in(conn, tenant, path, events, [0] * len(events), now, stream_id)
            if spec.closed:
                conn.execute("UPDATE streams SET closed=1 WHERE tenant_id=? AND sid=?", (tenant, sid))
                self._appends.fact(conn, tenant, stream_fact(STREAM_CLOSED, path, stream_id), now)
            row = conn.execute(BY_PATH, (tenant, path)).fetchone()
            return protocol_stream_from_row(row), True

    def _lifetime(self, conn: sqlite3.Connection, tenant: str, path: str) -> tuple[str, bool]:
        """The stream's lifetime id and whether it is soft-deleted: from the
        writer's copy of its row when the group's commits noted it there
        (anything that could soft-delete or delete drops the copies), else read."""
        kept = self._db.kept_row(tenant, path)
        if kept is not None and "p_deleted" in kept:
            return kept["stream_id"], kept["p_deleted"]
        row = conn.execute(LIFETIME_SELECT, (tenant, path)).fetchone()
        if row is None:
            raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
        return row[0], bool(row[1])

    def commit_guarded(
        self, conn: sqlite3.Connection, tenant: str, path: str, events: Sequence[PreparedEvent],
        batch_of: Sequence[int], now: int, new_stream_id: str, guards: Sequence[Guard | None],
    ) -> CommitResult:
        """``Store.commit`` with guards, inside the writer's transaction."""
        lifetime = one_lifetime(guards)
        if lifetime is not None:
            # Every protocol append carries its stream's lifetime: when that
            # is all it checks, the rows stay held back for the group's end.
            stream_id, deleted = self._lifetime(conn, tenant, path)
            if lifetime == stream_id and not deleted:
                result = self._appends.commit_in(conn, tenant, path, events, batch_of, now, new_stream_id)
                kept = self._db.kept_row(tenant, path)
                if kept is not None:
                    kept["p_deleted"] = deleted
                return CommitResult(outcomes=result.outcomes, head=result.head, guards=[OK] * len(guards))
        self._db.write_held(conn)  # the row must show the advances held back
        s = conn.execute(GUARDED_SELECT, (tenant, path)).fetchone()
        if s is None:  # protocol appends check that the stream exists first
            raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
        sid = s["sid"]
        p = s if s["p_sid"] is not None else None
        ids = sorted({g.producer[0] for g in guards if g is not None and g.producer is not None})
        producers: dict[str, tuple[int, int]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for pid, epoch, seq in conn.execute(
                "SELECT producer_id, epoch, seq FROM protocol_producers WHERE tenant_id=? AND sid=?"
                f" AND producer_id IN ({','.join('?' * len(chunk))})",
                (tenant, sid, *chunk),
            ):
                producers[pid] = (epoch, seq)
        book = GuardBook(
            closed=bool(s["closed"]), closed_by=p["p_closed_by"] if p else None,
            stream_seq=p["p_stream_seq"] if p else None, producers=producers,
            stream_id=s["stream_id"], deleted=bool(p and p["p_deleted"]),
        )
        decided, admitted, admitted_batch = decide_batches(book, events, batch_of, guards)
        result = self._appends.commit_in(conn, tenant, path, admitted, admitted_batch, now, new_stream_id, stream=s)
        head = result.head
        if book.changed:
            conn.executemany(
                "INSERT INTO protocol_producers VALUES (?,?,?,?,?,?) ON CONFLICT (tenant_id, sid, producer_id)"
                " DO UPDATE SET epoch=excluded.epoch, seq=excluded.seq, updated_ms=excluded.updated_ms",
                [(tenant, sid, pid, epoch, seq, now) for pid, (epoch, seq) in book.changed.items()],
            )
        if book.stream_changed:
            if p is None:
                conn.execute(
                    "INSERT INTO protocol_streams (tenant_id, sid, content_type, touched_ms)"
                    " VALUES (?, ?, 'application/json', ?)", (tenant, sid, now),
                )
            conn.execute(
                "UPDATE protocol_streams SET stream_seq=?, closed_by=? WHERE tenant_id=? AND sid=?",
                (book.stream_seq, book.closed_by, tenant, sid),
            )
            if book.closed and not s["closed"]:
                conn.execute("UPDATE streams SET closed=1 WHERE tenant_id=? AND sid=?", (tenant, sid))
                self._db.row_changed(tenant, path)
                self._appends.fact(conn, tenant, stream_fact(STREAM_CLOSED, path, s["stream_id"]), now)
        return assemble(events, batch_of, decided, result, head, now)
