"""Embedded backend: one SQLite file in WAL mode.

All writes go through one writer thread (SQLite allows one writer; a single
thread makes that explicit and keeps transactions short). Reads run on a
small pool of reader threads with their own connections; in WAL mode they
never block the writer and the writer never blocks them. ``synchronous=FULL``
makes every commit durable before ``commit`` returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from ..contract import CommitResult, Outcome, ReadPage, Retention, StreamInfo, WakeupCallback
from ..rows import EVENT_COLUMNS, STREAM_COLUMNS, event_from_row, stream_from_row
from ...events import PreparedEvent

T = TypeVar("T")

INSERT_EVENT = (
    "INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,"
    " correlation, priority, group_id, idempotency_key, fingerprint, size)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def path_from_url(url: str) -> Path:
    """``sqlite:///relative/or/abs.db`` → Path (``sqlite:////abs`` also works)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    return Path(url[len("sqlite:///") :])


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


class SqliteStore:
    def __init__(self, url: str, *, readers: int = 2) -> None:
        self.path = path_from_url(url)
        self._readers = readers
        self._writer: ThreadPoolExecutor | None = None
        self._reader_pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._wconn: sqlite3.Connection | None = None

    # --- lifecycle ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    async def start(self, on_wakeup: WakeupCallback, on_resync: Callable[[], None]) -> None:
        # Appends by this process wake tails in-process; other processes on
        # the same file are seen by the tails' periodic sweep.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="yoke-sqlite-writer")
        self._reader_pool = ThreadPoolExecutor(self._readers, thread_name_prefix="yoke-sqlite-reader")
        await self._write(self._open_writer)

    def _open_writer(self) -> None:
        self._wconn = self._connect()
        self._migrate(self._wconn)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        for version, sql in _migrations():
            if version <= current:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in sql.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self._writer is None:
            return
        await self._write(lambda: self._wconn.close() if self._wconn else None)
        self._writer.shutdown(wait=True)
        assert self._reader_pool is not None
        self._reader_pool.shutdown(wait=True)
        with self._lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()
        self._writer = None

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._writer is not None, "store not started"
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._reader_pool is not None, "store not started"
        return await asyncio.get_running_loop().run_in_executor(self._reader_pool, fn, *args)

    def _rconn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=1")
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    # --- writes --------------------------------------------------------------

    def _stream_row(self, conn: sqlite3.Connection, tenant: str, path: str) -> Any:
        return conn.execute(
            "SELECT sid, head, closed FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
        ).fetchone()

    def _ensure_stream(
        self, conn: sqlite3.Connection, tenant: str, path: str, stream_id: str, now: int,
        retention: Retention | None = None,
    ) -> tuple[Any, bool]:
        row = self._stream_row(conn, tenant, path)
        if row is not None:
            return row, False
        sid = conn.execute("SELECT coalesce(max(sid), 0) + 1 FROM streams").fetchone()[0]
        retention = retention or Retention()
        conn.execute(
            "INSERT INTO streams (tenant_id, path, sid, stream_id, created_at, max_age_s, max_events)"
            " VALUES (?,?,?,?,?,?,?)",
            (tenant, path, sid, stream_id, now, retention.max_age_s, retention.max_events),
        )
        return (sid, 0, 0), True

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
    ) -> CommitResult:
        return await self._write(self._commit, tenant, path, events, batch_of, now, new_stream_id)

    def _commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
    ) -> CommitResult:
        conn = self._wconn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            (sid, head, closed), _ = self._ensure_stream(conn, tenant, path, new_stream_id, now)
            if closed:
                conn.execute("ROLLBACK")
                return CommitResult(closed=True, outcomes=[], head=head)

            # Resolve idempotency keys under the write lock.
            prior: dict[str, tuple[int, str, int, str]] = {}
            keys = [e.idempotency_key for e in events if e.idempotency_key is not None]
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, seq, eid, at, fp in conn.execute(
                    "SELECT idempotency_key, seq, id, at, fingerprint FROM events"
                    f" WHERE tenant_id=? AND sid=? AND idempotency_key IN ({marks})",
                    (tenant, sid, *chunk),
                ):
                    prior[key] = (seq, eid, at, fp)
            rejected = {
                batch_of[i]
                for i, e in enumerate(events)
                if e.idempotency_key in prior and prior[e.idempotency_key][3] != e.fingerprint
            }

            outcomes: list[Outcome] = []
            rows = []
            for i, e in enumerate(events):
                if batch_of[i] in rejected:
                    outcomes.append(Outcome("conflict", None, e.id, now))
                elif e.idempotency_key in prior:
                    seq, eid, at, _ = prior[e.idempotency_key]
                    outcomes.append(Outcome("duplicate", seq, eid, at))
                else:
                    head += 1
                    outcomes.append(Outcome("ok", head, e.id, now))
                    if not e.ephemeral:
                        rows.append(
                            (
                                tenant, sid, head, e.id, now, e.type, e.payload_json,
                                e.metadata_json, e.source_json, e.correlation, e.priority,
                                e.group_id, e.idempotency_key, e.fingerprint, e.size,
                            )
                        )
            if rows:
                conn.executemany(INSERT_EVENT, rows)
            conn.execute("UPDATE streams SET head=? WHERE tenant_id=? AND sid=?", (head, tenant, sid))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return CommitResult(closed=False, outcomes=outcomes, head=head)

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, retention: Retention
    ) -> tuple[StreamInfo, bool]:
        def run() -> tuple[StreamInfo, bool]:
            conn = self._wconn
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            try:
                _, created = self._ensure_stream(conn, tenant, path, stream_id, now, retention)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            info = self._info(conn, tenant, path)
            assert info is not None
            return info, created

        return await self._write(run)

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
        params: list[Any] = []
        if closed is not None:
            sets.append("closed=?")
            params.append(int(closed))
        if legal_hold is not None:
            sets.append("legal_hold=?")
            params.append(int(legal_hold))
        if retention is not None:
            sets += ["max_age_s=?", "max_events=?"]
            params += [retention.max_age_s, retention.max_events]

        def run() -> StreamInfo | None:
            conn = self._wconn
            assert conn is not None
            if sets:
                conn.execute(
                    f"UPDATE streams SET {', '.join(sets)} WHERE tenant_id=? AND path=?",
                    (*params, tenant, path),
                )
            return self._info(conn, tenant, path)

        return await self._write(run)

    async def prune(self, now: int) -> int:
        return await self._write(self._prune, now)

    def _prune(self, now: int) -> int:
        conn = self._wconn
        assert conn is not None
        removed = 0
        candidates = conn.execute(
            "SELECT tenant_id, sid, pruned_through, max_age_s, max_events FROM streams"
            " WHERE legal_hold = 0 AND (max_age_s IS NOT NULL OR max_events IS NOT NULL)"
        ).fetchall()
        for tenant, sid, pruned_through, max_age_s, max_events in candidates:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-check under the write lock: a legal hold set meanwhile wins.
                held = conn.execute(
                    "SELECT legal_hold FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid)
                ).fetchone()
                threshold = 0
                if held is not None and not held[0]:
                    if max_events is not None:
                        row = conn.execute(
                            "SELECT seq FROM events WHERE tenant_id=? AND sid=?"
                            " ORDER BY seq DESC LIMIT 1 OFFSET ?",
                            (tenant, sid, max_events),
                        ).fetchone()
                        if row:
                            threshold = max(threshold, row[0])
                    if max_age_s is not None:
                        cutoff = now - int(max_age_s * 1000)
                        row = conn.execute(
                            "SELECT max(seq) FROM events WHERE tenant_id=? AND sid=? AND at < ?",
                            (tenant, sid, cutoff),
                        ).fetchone()
                        if row and row[0]:
                            threshold = max(threshold, row[0])
                if threshold > pruned_through:
                    cur = conn.execute(
                        "DELETE FROM events WHERE tenant_id=? AND sid=? AND seq <= ?",
                        (tenant, sid, threshold),
                    )
                    removed += cur.rowcount
                    conn.execute(
                        "UPDATE streams SET pruned_through=? WHERE tenant_id=? AND sid=?",
                        (threshold, tenant, sid),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return removed

    # --- reads ---------------------------------------------------------------

    def _info(self, conn: sqlite3.Connection, tenant: str, path: str) -> StreamInfo | None:
        row = conn.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
        ).fetchone()
        return stream_from_row(row) if row else None

    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        return await self._read(lambda: self._info(self._rconn(), tenant, path))

    async def read(self, tenant: str, path: str, after: int, limit: int) -> ReadPage:
        return await self._read(self._read_page, tenant, path, "seq > ? ORDER BY seq LIMIT ?", (after, limit))

    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        return await self._read(self._read_page, tenant, path, "seq = ?", (offset,))

    def _read_page(self, tenant: str, path: str, where: str, params: tuple[Any, ...]) -> ReadPage:
        conn = self._rconn()
        # One read transaction: the stream row and its events from one snapshot.
        conn.execute("BEGIN")
        try:
            row = conn.execute(
                "SELECT sid, head, pruned_through FROM streams WHERE tenant_id=? AND path=?",
                (tenant, path),
            ).fetchone()
            if row is None:
                return ReadPage(exists=False, head=0, pruned_through=0, events=[])
            sid, head, pruned_through = row
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant_id=? AND sid=? AND {where}",
                (tenant, sid, *params),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        return ReadPage(
            exists=True,
            head=head,
            pruned_through=pruned_through,
            events=[event_from_row(tenant, path, r) for r in rows],
        )

    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        def run() -> list[StreamInfo]:
            rows = self._rconn().execute(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=?"
                " AND substr(path, 1, ?) = ? AND path > ? ORDER BY path LIMIT ?",
                (tenant, len(prefix), prefix, after_path or "", limit),
            ).fetchall()
            return [stream_from_row(r) for r in rows]

        return await self._read(run)
