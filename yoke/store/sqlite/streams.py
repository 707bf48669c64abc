"""Streams on SQLite: create, settings, delete, retention, stream info and
listing, lifecycle facts, gap evidence."""

from __future__ import annotations

import logging
import sqlite3

from ... import errors
from ...events import PreparedEvent
from ...lifecycle import GLOBAL, STREAM_CLOSED, STREAM_DELETED, stream_fact
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
from ..rows import STREAM_COLUMNS, setting_changes, stream_from_row
from ..rules import age_cutoff, prune_through, unread_floor
from . import event_blocks
from .appends import SqliteAppends
from .connection import SqliteDb
from .objects import SqliteObjects

log = logging.getLogger("yoke.store.sqlite")

# Tables whose rows belong to one stream, by its sid or by its path (its
# events have no index by sid: they go first, found through event_blocks).
BY_SID = ("event_blocks", "consumers", "objects", "fanout_cursors", "input_outbox", "gap_evidence",
          "protocol_streams", "protocol_producers")
BY_PATH = ("subscriptions", "processor_checkpoints", "subscription_inbound", "subscription_catalogues")


def stream_info(conn: sqlite3.Connection, tenant: str, path: str) -> StreamInfo | None:
    row = conn.execute(
        f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
    ).fetchone()
    return stream_from_row(row) if row else None


class SqliteStreams:
    def __init__(self, db: SqliteDb, appends: SqliteAppends, objects: SqliteObjects) -> None:
        self._db = db
        self._appends = appends
        self._objects = objects

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        def run() -> tuple[StreamInfo, bool]:
            with self._db.transaction() as conn:
                _, created = self._appends.ensure_stream(conn, tenant, path, stream_id, now, settings)
            info = stream_info(conn, tenant, path)
            assert info is not None
            return info, created

        return await self._db.write(run)

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        def run() -> Outcome:
            with self._db.transaction() as conn:
                return self._appends.commit_in(
                    conn, tenant, GLOBAL, [event], [0], now, new_stream_id, kernel=True
                ).outcomes[0]

        return await self._db.write(run)

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
        sets, params = setting_changes(closed, legal_hold, retention, limits)

        def run() -> StreamInfo | None:
            with self._db.transaction() as conn:
                row = self._appends.stream_row(conn, tenant, path)
                if row is None:
                    return None
                if row["pinned"] and (retention is not None or limits is not None):
                    raise errors.StreamPinned(f"stream {path} is a pinned definition", path=path)
                if sets:
                    conn.execute(
                        f"UPDATE streams SET {', '.join(f'{c}=?' for c in sets)}"
                        " WHERE tenant_id=? AND path=?",
                        (*params, tenant, path),
                    )
                if closed and not row["closed"]:
                    fact = stream_fact(STREAM_CLOSED, path, row["stream_id"])
                    self._appends.fact(conn, tenant, fact, self._db.now_ms())
            return stream_info(conn, tenant, path)

        return await self._db.write(run)

    async def delete_stream(self, tenant: str, path: str) -> StreamInfo | None:
        def run() -> StreamInfo | None:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None:
                    return None
                if s["legal_hold"]:
                    raise errors.LegalHold(f"stream {path} is under legal hold", path=path)
                info = stream_info(conn, tenant, path)
                sid = s["sid"]
                objects = [
                    r[0] for r in conn.execute(
                        "SELECT object_id FROM objects WHERE tenant_id=? AND sid=?", (tenant, sid)
                    )
                ]
                self._objects.queue_deletions(conn, [(tenant, sid, object_id) for object_id in objects])
                conn.execute(
                    f"DELETE FROM event_rows WHERE row_id IN ({event_blocks.span('e.row_id')})",
                    event_blocks.everything(tenant, sid),
                )
                for table in BY_SID:
                    conn.execute(f"DELETE FROM {table} WHERE tenant_id=? AND sid=?", (tenant, sid))
                for table in BY_PATH:
                    conn.execute(f"DELETE FROM {table} WHERE tenant_id=? AND path=?", (tenant, path))
                conn.execute("DELETE FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid))
                if path != GLOBAL:  # (the global stream is never deleted)
                    fact = stream_fact(STREAM_DELETED, path, s["stream_id"])
                    self._appends.fact(conn, tenant, fact, self._db.now_ms())
            # After the commit, still on the writer thread: no upload (nor a
            # new stream that reuses this sid) runs in between. A crash here
            # leaves the files queued in object_deletions, never a row
            # without its file; the next cleanup pass deletes them.
            self._objects.drain_deletions()
            return info

        return await self._db.write(run)

    # --- retention -------------------------------------------------------------

    async def prune(self, now: int) -> int:
        def candidates() -> list[tuple[str, int]]:
            return self._db.reader().execute(
                "SELECT tenant_id, sid FROM streams"
                " WHERE legal_hold = 0 AND (max_age_s IS NOT NULL OR max_events IS NOT NULL)"
            ).fetchall()

        removed = 0
        # One writer job per stream, so appends interleave with a long pass;
        # a failing stream is logged and the pass goes on.
        for tenant, sid in await self._db.read(candidates):
            try:
                removed += await self._db.write(self._prune_stream, tenant, sid, now)
            except Exception:
                log_retried(log, "pruning %s stream %s failed", tenant, sid)
        return removed

    def _prune_stream(self, tenant: str, sid: int, now: int) -> int:
        with self._db.transaction() as conn:
            # Re-read under the write lock: a legal hold set meanwhile wins.
            s = conn.execute(
                "SELECT * FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid)
            ).fetchone()
            if s is None or s["legal_hold"]:
                return 0
            by_count = by_age = None
            stream = event_blocks.everything(tenant, sid)
            if s["max_events"] is not None:
                row = conn.execute(
                    event_blocks.span("seq", descending=True) + " LIMIT 1 OFFSET :skip",
                    {**stream, "skip": s["max_events"]},
                ).fetchone()
                by_count = row[0] if row else None
            if s["max_age_s"] is not None:
                row = conn.execute(  # from the newest back to the first one older than the cutoff
                    event_blocks.span("seq", where="e.at < :cutoff", descending=True) + " LIMIT 1",
                    {**stream, "cutoff": age_cutoff(now, s["max_age_s"])},
                ).fetchone()
                by_age = row[0] if row else None
            threshold = prune_through(s["pruned_through"], by_count, by_age)
            if threshold is None:
                return 0
            min_ack = unread_floor(s["min_ack"], threshold)
            through = {**stream, "hi": threshold}
            n, size, n_unread, size_unread = conn.execute(
                "SELECT count(*), coalesce(sum(size), 0),"
                " count(*) FILTER (WHERE seq > :acked), coalesce(sum(size) FILTER (WHERE seq > :acked), 0)"
                f" FROM ({event_blocks.span('seq, size', bounded=True)})",
                {**through, "acked": min_ack},
            ).fetchone()
            conn.execute(
                f"DELETE FROM event_rows WHERE row_id IN ({event_blocks.span('e.row_id', bounded=True)})", through
            )
            conn.execute(event_blocks.DROP_BLOCKS_THROUGH, through)
            conn.execute(event_blocks.TRIM_BLOCK_AFTER, through)
            conn.execute(
                "UPDATE streams SET pruned_through=?, durable_events=durable_events-?,"
                " durable_bytes=durable_bytes-?, unread_events=unread_events-?,"
                " unread_bytes=unread_bytes-? WHERE tenant_id=? AND sid=?",
                (threshold, n, size, n_unread, size_unread, tenant, sid),
            )
        return n

    # --- stream info ------------------------------------------------------------

    @retry_reads
    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        return await self._db.read(lambda: stream_info(self._db.reader(), tenant, path))

    @retry_reads
    async def stream_totals(self, tenant: str) -> StreamTotals:
        def run() -> StreamTotals:
            row = self._db.reader().execute(
                "SELECT count(*), coalesce(sum(head), 0) FROM streams WHERE tenant_id=?", (tenant,)
            ).fetchone()
            return StreamTotals(row[0], row[1])

        return await self._db.read(run)

    @retry_reads
    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        def run() -> list[StreamInfo]:
            rows = self._db.reader().execute(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=?"
                " AND substr(path, 1, ?) = ? AND path > ? ORDER BY path LIMIT ?",
                (tenant, len(prefix), prefix, after_path or "", limit),
            ).fetchall()
            return [stream_from_row(r) for r in rows]

        return await self._db.read(run)

    # --- gap evidence ------------------------------------------------------------

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None:
                    return
                conn.execute(
                    "INSERT OR IGNORE INTO gap_evidence VALUES (?,?,?,?,?,?,?)",
                    (tenant, s["sid"], at, first, last, cause, process),
                )
                conn.execute(
                    "DELETE FROM gap_evidence WHERE tenant_id=? AND sid=? AND detected_at < ("
                    " SELECT detected_at FROM gap_evidence WHERE tenant_id=? AND sid=?"
                    " ORDER BY detected_at DESC LIMIT 1 OFFSET ?)",
                    (tenant, s["sid"], tenant, s["sid"], MAX_GAPS - 1),
                )

        await self._db.write(run)

    @retry_reads
    async def gaps(self, tenant: str, path: str, limit: int) -> list[GapEvidence]:
        rows = await self._db.fetchall(
            "SELECT g.first_seq, g.last_seq, g.cause, g.detected_at, g.process FROM gap_evidence g"
            " JOIN streams s ON s.tenant_id = g.tenant_id AND s.sid = g.sid"
            " WHERE s.tenant_id=? AND s.path=? ORDER BY g.detected_at DESC, g.first_seq DESC LIMIT ?",
            (tenant, path, limit),
        )
        return [GapEvidence(*r) for r in rows]
