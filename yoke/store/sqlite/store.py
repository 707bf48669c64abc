"""Embedded backend: one SQLite file in WAL mode.

All writes go through one writer thread (SQLite allows one writer; a single
thread makes that explicit and keeps transactions short). Reads run on a
small pool of reader threads with their own connections; in WAL mode they
never block the writer and the writer never blocks them. ``synchronous=FULL``
makes every commit durable before ``commit`` returns.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ... import errors
from ...events import PreparedEvent, any_ephemeral, any_object, idempotency_keys, now_ms, size_of
from ...lifecycle import GLOBAL, STREAM_CLOSED, STREAM_CREATED, STREAM_DELETED, new_stream_id, stream_fact
from ..contract import (
    Admitted,
    CommitResult,
    ConsumerInfo,
    Limits,
    ObjectInfo,
    Outcome,
    PayloadPage,
    ReadPage,
    Retention,
    StreamInfo,
    StreamSettings,
    StreamTotals,
    TokenInfo,
    MAX_GAPS,
    EphemeralCallback,
    GapEvidence,
    WakeupCallback,
)
from ..rows import (
    ONE_ROW_MAX_BYTES,
    EVENT_COLUMNS,
    OBJECT_COLUMNS,
    STREAM_COLUMNS,
    TOKEN_COLUMNS,
    check_object_bytes,
    consumer_from_row,
    credit_lacking as _credit_lacking,
    event_from_row,
    object_from_row,
    setting_changes as _setting_changes,
    stored_event_from_row,
    stream_from_row,
    token_from_row,
)

from ..faults import log_retried, retry_reads, unavailable
from ..schema import Migration, Recorded, check_recorded, read_migrations
from . import event_blocks
from .actors import SqliteActorStore
from .group_writes import Block, GroupWrites
from ..protocol import Guard
from .outbox import SqliteOutboxStore
from .protocol import SqliteProtocolStore
from .subscriptions import SqliteSubscriptionStore

T = TypeVar("T")
log = logging.getLogger("yoke.store.sqlite")

# The page size of a new database file. Event rows are a few hundred bytes:
# 8 KiB pages halve the WAL frames (one write call each) a commit writes;
# batch appends took 8-10% less CPU, single appends the same (measured when
# the events table was WITHOUT ROWID, before migration 0013).
PAGE_SIZE = 8192
# How many stream rows the writer keeps copies of (see SqliteStore._stream_rows).
STREAM_ROWS_KEPT = 4096


# An object's row by stream path, with its stream's sid and closed flag.
OBJECT_SELECT = (
    f"SELECT {', '.join('o.' + c.strip() for c in OBJECT_COLUMNS.split(','))}, s.sid, s.closed"
    " FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
    " WHERE s.tenant_id=? AND s.path=? AND o.object_id=?"
)


# SQLite result codes (the primary code is the low byte of an extended one)
# that say the database file cannot be used right now, not that the
# statement is wrong: still locked when the busy timeout ran out, an I/O
# error, a full disk, a file that cannot be opened.
_FAULTS = {
    sqlite3.SQLITE_BUSY: ("the database is locked; retry later", "database_locked"),
    sqlite3.SQLITE_LOCKED: ("the database is locked; retry later", "database_locked"),
    sqlite3.SQLITE_IOERR: ("the database file could not be read or written; retry later", "io_error"),
    sqlite3.SQLITE_CANTOPEN: ("the database file could not be opened; retry later", "io_error"),
    sqlite3.SQLITE_FULL: ("the disk holding the database is full", "disk_full"),
}


# What a read takes from the stream's row, in the read's snapshot.
READ_STREAM = (
    "SELECT sid, head, pruned_through, closed, stream_id, created_at FROM streams WHERE tenant_id=? AND path=?"
)
# read_stored takes these of EVENT_COLUMNS's positions (the rest: NULL).
STORED_COLUMNS = "seq, NULL, NULL, type, payload, NULL, NULL, NULL, NULL, NULL, NULL"
# Pages longer than this are read in one row (SqliteStore._read_range), when
# a byte cap keeps the row's text small (rows.ONE_ROW_MAX_BYTES).
STEPPED_ROWS = 32
# A page in one row: how many events the limit takes, and those the byte cap
# keeps (the first always; then while the running total of sizes stays
# within the cap) as one JSON array of [EVENT_COLUMNS (or STORED_COLUMNS)...,
# size, hex(data)]. The running total is taken over (row id, seq, size)
# alone, so rows past the cap are not read; the kept rows are then read by
# row id in the window's order (not sorted again: _page_in_one_row checks it).
NO_CAP = 2**62
PAGE_IN_ONE_ROW = """
WITH w AS (
    SELECT rid, sum(size) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS running,
           row_number() OVER (ORDER BY seq) AS rn
    FROM ({span} LIMIT :n)
), kept AS (SELECT rid FROM w WHERE rn = 1 OR running <= :cap)
SELECT (SELECT count(*) FROM w),
       (SELECT json_group_array(json_array({{columns}}, size, data))
        FROM (SELECT {{columns}}, size, CASE WHEN data IS NULL THEN NULL ELSE hex(data) END AS data
              FROM kept k JOIN event_rows e ON e.row_id = k.rid) e)
""".format(span=event_blocks.span("e.row_id AS rid, seq, size"))
# read_payloads: of the events the limit takes, how many, their total size,
# how many are of another type or carry bytes, their offsets, and their
# payload texts as one JSON array (bytes: no decoding in the sqlite3
# module). Before 3.44 SQLite does not promise group_concat's order (it
# keeps the subquery's in practice): the offsets say whether it did.
PAYLOAD_PAGE = (
    "SELECT count(*), coalesce(sum(size), 0), count(*) FILTER (WHERE type <> :type OR data IS NOT NULL),"
    " group_concat(seq), CAST('[' || coalesce(group_concat(payload, ','), '') || ']' AS BLOB)"
    f" FROM ({event_blocks.span('seq, size, type, payload, data')} LIMIT :n)"
)
EVENT_PAGE = PAGE_IN_ONE_ROW.format(columns=EVENT_COLUMNS.replace("seq,", "e.seq,", 1))
STORED_PAGE = PAGE_IN_ONE_ROW.format(columns=STORED_COLUMNS.replace("seq,", "e.seq,", 1))


def _settle_commits(
    jobs: Sequence[tuple[asyncio.Future[CommitResult], tuple[Any, ...]]], outcomes: Sequence[tuple[bool, Any]]
) -> None:
    for (future, _), (ok, value) in zip(jobs, outcomes, strict=True):
        if future.done():  # the caller was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception((_fault(value) or value) if isinstance(value, sqlite3.Error) else value)


def _fault(exc: sqlite3.Error) -> errors.Unavailable | None:
    """``Unavailable`` for a fault of the database file; None for a real SQL error."""
    code = getattr(exc, "sqlite_errorcode", None)
    found = _FAULTS.get(code & 0xFF) if isinstance(code, int) else None
    if found is None:
        return None
    fault = unavailable(*found)
    fault.__cause__ = exc
    return fault


def path_from_url(url: str) -> Path:
    """``sqlite:///relative/or/abs.db`` → Path (``sqlite:////abs`` also works)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    return Path(url[len("sqlite:///") :])


def _migrations() -> list[Migration]:
    return read_migrations(__package__)


# Which migrations the file holds: PRAGMA user_version keeps only the
# newest number, so each one is also recorded by name and checksum (as on
# PostgreSQL) and checked against the files before anything is applied.
VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS yoke_schema_version ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT, applied_at INTEGER NOT NULL)"
)


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _recorded(conn: sqlite3.Connection) -> dict[int, Recorded]:
    if conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'yoke_schema_version'"
    ).fetchone() is None:
        return {}
    return {
        r[0]: Recorded(r[1], r[2])
        for r in conn.execute("SELECT version, name, checksum FROM yoke_schema_version")
    }


class _OneCommitRaised(Exception):
    """A commit of a group run without savepoints raised: run the group again, isolated."""


def _bind_object(conn: sqlite3.Connection, tenant: str, sid: int, object_id: str, seq: int) -> None:
    """The uploaded object is committed by the record at ``seq``."""
    conn.execute(
        "UPDATE objects SET state='committed', committed_seq=?"
        " WHERE tenant_id=? AND sid=? AND object_id=? AND state='uploaded'",
        (seq, tenant, sid, object_id),
    )


_batch_of_pair = operator.itemgetter(0)
_size_of_pair = operator.itemgetter(1)


def batch_counts(
    events: Sequence[PreparedEvent], batch_of: Sequence[int], prior: Mapping[str, Any]
) -> dict[int, list[int]]:
    """Per caller batch: [durable events, their bytes, events that take an
    offset] (an event whose idempotency key is stored takes none)."""
    per_batch: dict[int, list[int]] = {}
    if not prior and not any_ephemeral(events):
        # Most commits: every event new and durable, each batch's events
        # side by side: counted a batch at a time, the events at C speed.
        for b, members in itertools.groupby(zip(batch_of, map(size_of, events)), _batch_of_pair):
            pairs = list(members)
            counts = per_batch.setdefault(b, [0, 0, 0])
            counts[0] += len(pairs)
            counts[1] += sum(map(_size_of_pair, pairs))
            counts[2] += len(pairs)
        return per_batch
    for i, e in enumerate(events):
        counts = per_batch.setdefault(batch_of[i], [0, 0, 0])
        if e.idempotency_key not in prior:
            counts[2] += 1  # takes an offset
            if not e.ephemeral:
                counts[0] += 1
                counts[1] += e.size
    return per_batch


class SqliteStore:
    def __init__(self, url: str, *, readers: int = 2) -> None:
        self.path = path_from_url(url)
        self._readers = readers
        self._writer: ThreadPoolExecutor | None = None
        # Commits waiting for the writer thread (under _lock), and whether a
        # _commit_waiting job is queued to take them.
        self._commits: list[tuple[asyncio.Future[CommitResult], tuple[Any, ...]]] = []
        self._commits_queued = False
        # What a group run without savepoints holds back to its end (the
        # writer thread's alone; None otherwise).
        self._held: GroupWrites | None = None
        # The writer's copies of the stream rows that plain commits read, by
        # (tenant, path): kept up to date by those commits, used only in
        # groups without savepoints (while _held is set), emptied by anything else the writer runs
        # and when another connection has committed (PRAGMA data_version).
        # Reading a row costs three GIL hand-backs; most groups need none.
        self._stream_rows: dict[tuple[str, str], dict[str, Any]] = {}
        self._stream_rows_version: int | None = None
        self._reader_pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._wconn: sqlite3.Connection | None = None
        self.actors = SqliteActorStore(self)
        self.subscriptions = SqliteSubscriptionStore(self)
        self.protocol = SqliteProtocolStore(self)
        self.outbox = SqliteOutboxStore(self)

    # --- lifecycle ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, cached_statements=256)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only; an existing one keeps its own
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    # One process owns the file: its ephemeral events never leave it.
    relays_ephemeral = False

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        return True

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None,
    ) -> None:
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
        files = _migrations()
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        seen = _recorded(conn)
        if current and not seen:
            # Migrated before names were recorded: take the files up to
            # user_version as the ones applied (they cannot be checked), so
            # that from now on every migration is.
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(VERSION_TABLE)
                conn.executemany(
                    "INSERT OR IGNORE INTO yoke_schema_version VALUES (?, ?, ?, ?)",
                    [(m.version, m.name, m.checksum, now_ms()) for m in files if m.version <= current],
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            seen = _recorded(conn)
        check_recorded(seen, files)
        for m in files:
            if m.version <= current:
                continue
            try:
                conn.executescript(
                    f"BEGIN IMMEDIATE;\n{m.sql}\n;{VERSION_TABLE};\n"
                    f"INSERT INTO yoke_schema_version VALUES ({m.version}, {_sql_text(m.name)},"
                    f" {_sql_text(m.checksum)}, {now_ms()});\n"
                    f"PRAGMA user_version = {m.version};\nCOMMIT;"
                )
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self._writer is None:
            return
        await self._write(lambda: self._wconn.close() if self._wconn else None)
        writer, readers = self._writer, self._reader_pool
        self._writer = self._reader_pool = None
        # Let queued jobs finish without blocking the event loop.
        await asyncio.to_thread(writer.shutdown, wait=True)
        if readers is not None:
            await asyncio.to_thread(readers.shutdown, wait=True)
        with self._lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()

    async def ready(self) -> None:
        def check() -> None:
            conn = self._rconn()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            files = _migrations()
            check_recorded(_recorded(conn), files)
            if version < files[-1].version:
                raise errors.YokeError(f"schema version {version}, expected {files[-1].version}")

        await self._read(check)

    async def _write(self, fn: Callable[..., T], *args: Any, streams_unchanged: bool = False) -> T:
        """``fn(*args)`` on the writer thread. ``streams_unchanged``: fn
        writes no ``streams`` row, so the writer's copies stay."""
        if self._writer is None:
            raise errors.RuntimeClosed("the store is closed")
        run = fn if streams_unchanged else functools.partial(self._write_other, fn)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._writer, run, *args)
        except sqlite3.Error as exc:
            raise _fault(exc) or exc

    def _write_other(self, fn: Callable[..., T], *args: Any) -> T:
        self._stream_rows.clear()  # fn may change stream rows
        return fn(*args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._reader_pool is None:
            raise errors.RuntimeClosed("the store is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reader_pool, fn, *args)
        except sqlite3.Error as exc:
            raise _fault(exc) or exc

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

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer thread's connection."""
        conn = self._wconn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _stream_row(self, conn: sqlite3.Connection, tenant: str, path: str) -> sqlite3.Row | None:
        return conn.execute(
            "SELECT * FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
        ).fetchone()

    def _ensure_stream(
        self, conn: sqlite3.Connection, tenant: str, path: str, stream_id: str, now: int,
        settings: StreamSettings | None = None,
    ) -> tuple[sqlite3.Row, bool]:
        if self._held is not None:
            cached = self._stream_rows.get((tenant, path))
            if cached is not None:
                return cached, False  # type: ignore[return-value]  # read like a row
        self._write_held(conn)  # the row must show the advances held back
        row = self._stream_row(conn, tenant, path)
        if row is not None:
            if self._held is not None:
                self._stream_rows[(tenant, path)] = dict(row)
            return row, False
        sid = conn.execute("SELECT coalesce(max(sid), 0) + 1 FROM streams").fetchone()[0]
        st = settings or StreamSettings()
        lim = st.limits
        conn.execute(
            "INSERT INTO streams (tenant_id, path, sid, stream_id, created_at, max_age_s,"
            " max_events, max_unread_events, max_unread_bytes, max_total_events,"
            " max_total_bytes, overflow, block_timeout_s, pinned, metadata, data_handling)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                tenant, path, sid, stream_id, now, st.retention.max_age_s,
                st.retention.max_events, lim.max_unread_events, lim.max_unread_bytes,
                lim.max_total_events, lim.max_total_bytes, lim.overflow, lim.block_timeout_s,
                int(st.pinned), orjson.dumps(st.metadata).decode(),
                None if st.data_handling is None else orjson.dumps(st.data_handling).decode(),
            ),
        )
        if path != GLOBAL:  # the global stream's own creation would take its offset 1
            self._fact(conn, tenant, stream_fact(STREAM_CREATED, path, stream_id, created_at=now), now)
        row = self._stream_row(conn, tenant, path)
        assert row is not None
        return row, True

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        def run() -> Outcome:
            with self._transaction() as conn:
                return self._commit_in(conn, tenant, GLOBAL, [event], [0], now, new_stream_id, kernel=True).outcomes[0]

        return await self._write(run)

    def _fact(self, conn: sqlite3.Connection, tenant: str, event: PreparedEvent, now: int) -> None:
        """A lifecycle fact on the tenant's global stream, in the caller's transaction."""
        self._commit_in(conn, tenant, GLOBAL, [event], [0], now, new_stream_id(), kernel=True)

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        guards: Sequence[Guard | None] | None = None,
    ) -> CommitResult:
        return await self._grouped((tenant, path, events, batch_of, now, new_stream_id, guards))

    async def _write_grouped(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` in the next group commit, in a savepoint of its own
        (an exception rolls back ``fn``'s writes alone and reaches the caller)."""
        return await self._grouped(fn)

    async def _grouped(self, job: Any) -> Any:
        if self._writer is None:
            raise errors.RuntimeClosed("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._commits.append((future, job))
            start, self._commits_queued = not self._commits_queued, True
        if start:
            try:
                self._writer.submit(self._commit_waiting, loop)
            except RuntimeError:  # the writer shut down meanwhile
                with self._lock:
                    waiting, self._commits, self._commits_queued = self._commits, [], False
                for f, _ in waiting:
                    if not f.done():
                        f.set_exception(errors.RuntimeClosed("the store is closed"))
        return await future

    def _commit_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread: every commit waiting (appends to different
        streams come as separate commits) in one transaction, so that one
        fsync and one handoff to the event loop serve them all. They run
        without savepoints first (two statements fewer per commit, each a GIL
        hand-back); when one raises, the transaction is rolled back and the
        group runs again with a savepoint per commit, so that one rolls back
        alone. A failed COMMIT fails them all (nothing was written)."""
        with self._lock:
            jobs, self._commits, self._commits_queued = self._commits, [], False
        conn = self._wconn
        try:
            if conn is None:
                raise errors.RuntimeClosed("the store is closed")
            try:
                # A _write_grouped function is not run twice (its Python side
                # may not be repeatable): a group holding one is isolated at once.
                outcomes = self._commit_group(conn, jobs, isolated=any(callable(job) for _, job in jobs))
            except _OneCommitRaised:
                outcomes = self._commit_group(conn, jobs, isolated=True)
        except Exception as exc:
            if isinstance(exc, sqlite3.ProgrammingError):  # the connection was closed
                exc = errors.RuntimeClosed("the store is closed")
            outcomes = [(False, exc)] * len(jobs)
        loop.call_soon_threadsafe(_settle_commits, jobs, outcomes)

    def _commit_group(
        self, conn: sqlite3.Connection, jobs: list[tuple[asyncio.Future[Any], Any]],
        *, isolated: bool,
    ) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]  # under the write lock
            if isolated or version != self._stream_rows_version or len(self._stream_rows) > STREAM_ROWS_KEPT:
                self._stream_rows.clear()
            self._stream_rows_version = version
            self._held = None if isolated else GroupWrites()
            for future, args in jobs:
                if future.done():  # its caller was cancelled before the writer got to it
                    outcomes.append((False, None))
                    continue
                if isolated:
                    conn.execute("SAVEPOINT yoke_commit")
                try:
                    outcomes.append((True, args(conn) if callable(args) else self._commit_one(conn, *args)))
                except Exception as exc:
                    if not conn.in_transaction:
                        raise  # SQLite rolled the whole transaction back (disk full, I/O): all fail
                    if not isolated:
                        raise _OneCommitRaised from exc
                    conn.execute("ROLLBACK TO yoke_commit")
                    outcomes.append((False, exc))
                if isolated:
                    conn.execute("RELEASE yoke_commit")
            self._write_held(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._stream_rows.clear()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            self._held = None
        return outcomes

    def _write_held(self, conn: sqlite3.Connection) -> None:
        """Write what the group held back so far: at its end, and before a
        statement that reads events or stream rows."""
        if self._held is None:
            return
        try:
            self._held.write(conn)
        except Exception as exc:
            if not conn.in_transaction:
                raise
            raise _OneCommitRaised from exc  # which commit's rows it was shows when isolated

    def _commit_one(
        self,
        conn: sqlite3.Connection,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        guards: Sequence[Guard | None] | None = None,
    ) -> CommitResult:
        if guards is not None:
            return self.protocol.commit_guarded(conn, tenant, path, events, batch_of, now, new_stream_id, guards)
        return self._commit_in(conn, tenant, path, events, batch_of, now, new_stream_id)

    def _commit_in(
        self,
        conn: sqlite3.Connection,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        *,
        kernel: bool = False,
        stream: sqlite3.Row | None = None,
    ) -> CommitResult:
        # The same steps as yoke_append in the PostgreSQL schema, inside the
        # caller's write transaction. ``kernel``: subscription bookkeeping
        # (control events, audit lines) that a closed or full stream still takes.
        # ``stream``: the stream's row, when the caller read it in this transaction.
        s = stream if stream is not None else self._ensure_stream(conn, tenant, path, new_stream_id, now)[0]
        sid, head = s["sid"], s["head"]

        # 1. Idempotency keys, under the write lock.
        prior: dict[str, tuple[int, str, int, str]] = {}
        keys = idempotency_keys(events)
        if keys:
            self._write_held(conn)  # a key may be in a row this group holds back
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for key, seq, eid, at, fp in conn.execute(
                "SELECT idempotency_key, seq, id, at, fingerprint FROM event_rows"
                f" WHERE tenant_id=? AND sid=? AND idempotency_key IN ({marks})",
                (tenant, sid, *chunk),
            ):
                prior[key] = (seq, eid, at, fp)
        refused: dict[int, str] = {}
        for i, e in enumerate(events if prior else ()):
            key = e.idempotency_key
            if key in prior and prior[key][3] != e.fingerprint:
                refused[batch_of[i]] = "conflict"

        # 2. Object bindings: a new record may only reference an uploaded
        # object that has not expired; a duplicate counts only when its
        # object was committed by the record the key found.
        has_objects = any_object(events)
        for i, e in enumerate(events if has_objects else ()):
            if e.object_id is None:
                continue
            obj = conn.execute(
                "SELECT state, expires_at, committed_seq FROM objects"
                " WHERE tenant_id=? AND sid=? AND object_id=?",
                (tenant, sid, e.object_id),
            ).fetchone()
            if e.idempotency_key in prior:
                bound = obj is not None and obj[0] == "committed" and obj[2] == prior[e.idempotency_key][0]
            else:
                bound = obj is not None and obj[0] == "uploaded" and obj[1] >= now
            if not bound:
                refused.setdefault(batch_of[i], "object")

        # 3. Producer credit, batch by batch, from the durable counters.
        per_batch = batch_counts(events, batch_of, prior)
        added_events = added_bytes = 0
        lack: str | None = None
        for batch, (n_events, n_bytes, n_fresh) in sorted(per_batch.items()):
            if batch in refused:
                continue
            if s["closed"] and n_fresh and not kernel:
                # A closed stream takes nothing new; pure retries still
                # get their original offsets.
                refused[batch] = "closed"
                continue
            if lack is None and n_events and not kernel:
                lack = _credit_lacking(s, added_events + n_events, added_bytes + n_bytes)
            if lack is not None:
                refused[batch] = lack
                continue
            added_events += n_events
            added_bytes += n_bytes

        # 4. Number the admitted new events, insert the durable ones, bind objects.
        outcomes: Sequence[Outcome]
        if not refused and not prior:  # the common case: every event taken, in one pass
            outcomes = Admitted(head + 1, events, now)
            seqs: Sequence[int] = range(head + 1, head + 1 + len(events))
            durable: Sequence[PreparedEvent] = events
            if any_ephemeral(events):  # they take offsets, not rows
                kept = [(seq, e) for seq, e in zip(seqs, events) if not e.ephemeral]
                seqs, durable = [seq for seq, _ in kept], [e for _, e in kept]
            for seq, e in enumerate(events if has_objects else (), head + 1):
                if e.object_id is not None:
                    _bind_object(conn, tenant, sid, e.object_id, seq)
            head += len(events)
        else:
            outcomes = []
            seqs, durable = [], []
            for i, e in enumerate(events):
                if batch_of[i] in refused:
                    outcomes.append(Outcome(refused[batch_of[i]], None, e.id, now))  # type: ignore[arg-type]
                elif e.idempotency_key in prior:
                    seq, eid, at, _ = prior[e.idempotency_key]
                    outcomes.append(Outcome("duplicate", seq, eid, at))
                else:
                    head += 1
                    outcomes.append(Outcome("ok", head, e.id, now))
                    if not e.ephemeral:
                        seqs.append(head)
                        durable.append(e)
                    if e.object_id is not None:
                        _bind_object(conn, tenant, sid, e.object_id, head)
        unread = 0 if s["min_ack"] is None else 1
        held = self._held if self._held is not None else GroupWrites()
        if seqs:
            held.blocks.append(Block(tenant, sid, now, seqs, durable))
        held.advance(tenant, sid, head, added_events, added_bytes, bool(unread))
        if self._held is None:
            held.write(conn)  # in a savepoint or a transaction of its own: now
        cached = self._stream_rows.get((tenant, path)) if self._held is not None else None
        if cached is not None:  # s is the row as it was before this commit
            cached.update(
                head=head, durable_events=s["durable_events"] + added_events,
                durable_bytes=s["durable_bytes"] + added_bytes,
                unread_events=s["unread_events"] + added_events * unread,
                unread_bytes=s["unread_bytes"] + added_bytes * unread,
            )
        return CommitResult(outcomes=outcomes, head=head)

    def _stream_row_changed(self, tenant: str, path: str) -> None:
        """A commit in a group changed its stream's row other than by appending."""
        self._stream_rows.pop((tenant, path), None)

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        def run() -> tuple[StreamInfo, bool]:
            with self._transaction() as conn:
                _, created = self._ensure_stream(conn, tenant, path, stream_id, now, settings)
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
        limits: Limits | None = None,
    ) -> StreamInfo | None:
        sets, params = _setting_changes(closed, legal_hold, retention, limits)

        def run() -> StreamInfo | None:
            with self._transaction() as conn:
                row = self._stream_row(conn, tenant, path)
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
                    self._fact(conn, tenant, stream_fact(STREAM_CLOSED, path, row["stream_id"]), now_ms())
            return self._info(conn, tenant, path)

        return await self._write(run)

    # Tables whose rows belong to one stream, by its sid or by its path (its
    # events have no index by sid: they go first, found through event_blocks).
    _BY_SID = ("event_blocks", "consumers", "objects", "fanout_cursors", "input_outbox", "gap_evidence",
               "protocol_streams", "protocol_producers")
    _BY_PATH = ("subscriptions", "processor_checkpoints", "subscription_inbound", "subscription_catalogues")

    async def delete_stream(self, tenant: str, path: str) -> StreamInfo | None:
        def run() -> StreamInfo | None:
            with self._transaction() as conn:
                s = self._stream_row(conn, tenant, path)
                if s is None:
                    return None
                if s["legal_hold"]:
                    raise errors.LegalHold(f"stream {path} is under legal hold", path=path)
                info = self._info(conn, tenant, path)
                sid = s["sid"]
                objects = [
                    r[0] for r in conn.execute(
                        "SELECT object_id FROM objects WHERE tenant_id=? AND sid=?", (tenant, sid)
                    )
                ]
                self._queue_deletions(conn, [(tenant, sid, object_id) for object_id in objects])
                conn.execute(
                    f"DELETE FROM event_rows WHERE row_id IN ({event_blocks.span('e.row_id')})",
                    event_blocks.everything(tenant, sid),
                )
                for table in self._BY_SID:
                    conn.execute(f"DELETE FROM {table} WHERE tenant_id=? AND sid=?", (tenant, sid))
                for table in self._BY_PATH:
                    conn.execute(f"DELETE FROM {table} WHERE tenant_id=? AND path=?", (tenant, path))
                conn.execute("DELETE FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid))
                if path != GLOBAL:  # (the global stream is never deleted)
                    self._fact(conn, tenant, stream_fact(STREAM_DELETED, path, s["stream_id"]), now_ms())
            # After the commit, still on the writer thread: no upload (nor a
            # new stream that reuses this sid) runs in between. A crash here
            # leaves the files queued in object_deletions, never a row
            # without its file; the next cleanup pass deletes them.
            self._drain_deletions()
            return info

        return await self._write(run)

    async def prune(self, now: int) -> int:
        def candidates() -> list[tuple[str, int]]:
            return self._rconn().execute(
                "SELECT tenant_id, sid FROM streams"
                " WHERE legal_hold = 0 AND (max_age_s IS NOT NULL OR max_events IS NOT NULL)"
            ).fetchall()

        removed = 0
        # One writer job per stream, so appends interleave with a long pass;
        # a failing stream is logged and the pass goes on.
        for tenant, sid in await self._read(candidates):
            try:
                removed += await self._write(self._prune_stream, tenant, sid, now)
            except Exception:
                log_retried(log, "pruning %s stream %s failed", tenant, sid)
        return removed

    def _prune_stream(self, tenant: str, sid: int, now: int) -> int:
        with self._transaction() as conn:
            # Re-read under the write lock: a legal hold set meanwhile wins.
            s = conn.execute(
                "SELECT * FROM streams WHERE tenant_id=? AND sid=?", (tenant, sid)
            ).fetchone()
            if s is None or s["legal_hold"]:
                return 0
            threshold = 0
            stream = event_blocks.everything(tenant, sid)
            if s["max_events"] is not None:
                row = conn.execute(
                    event_blocks.span("seq", descending=True) + " LIMIT 1 OFFSET :skip",
                    {**stream, "skip": s["max_events"]},
                ).fetchone()
                if row:
                    threshold = max(threshold, row[0])
            if s["max_age_s"] is not None:
                cutoff = now - int(s["max_age_s"] * 1000)
                row = conn.execute(  # from the newest back to the first one older than the cutoff
                    event_blocks.span("seq", where="e.at < :cutoff", descending=True) + " LIMIT 1",
                    {**stream, "cutoff": cutoff},
                ).fetchone()
                if row and row[0]:
                    threshold = max(threshold, row[0])
            if threshold <= s["pruned_through"]:
                return 0
            min_ack = s["min_ack"] if s["min_ack"] is not None else threshold
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

    # --- consumers -----------------------------------------------------------

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        def run() -> ConsumerInfo:
            with self._transaction() as conn:
                s = self._stream_row(conn, tenant, path)
                if s is None:
                    raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
                if offset > s["head"]:
                    raise errors.InvalidAck(
                        f"offset {offset} is beyond the head {s['head']}", offset=offset, latest=s["head"]
                    )
                sid = s["sid"]
                row = conn.execute(
                    "SELECT acked, created_at FROM consumers WHERE tenant_id=? AND sid=? AND consumer_id=?",
                    (tenant, sid, consumer_id),
                ).fetchone()
                if row is not None and offset < row[0]:
                    raise errors.AckRegression(
                        f"consumer {consumer_id} already acknowledged {row[0]}",
                        consumer=consumer_id, acked=row[0], offset=offset,
                    )
                created = row[1] if row is not None else now
                conn.execute(
                    "INSERT INTO consumers (tenant_id, sid, consumer_id, acked, created_at, updated_at)"
                    " VALUES (?,?,?,?,?,?) ON CONFLICT (tenant_id, sid, consumer_id)"
                    " DO UPDATE SET acked=excluded.acked, updated_at=excluded.updated_at",
                    (tenant, sid, consumer_id, offset, created, now),
                )
                self._recount_unread(conn, tenant, s)
            return ConsumerInfo(consumer_id, offset, created, now)

        return await self._write(run)

    def _recount_unread(self, conn: sqlite3.Connection, tenant: str, s: sqlite3.Row) -> None:
        """After consumers changed: move min_ack and keep the unread counters exact."""
        sid, old = s["sid"], s["min_ack"]
        new = conn.execute(
            "SELECT min(acked) FROM consumers WHERE tenant_id=? AND sid=?", (tenant, sid)
        ).fetchone()[0]
        if new == old:
            return
        if new is None:
            events = size = 0
        elif old is not None and new > old:
            n, b = conn.execute(
                f"SELECT count(*), coalesce(sum(size), 0) FROM ({event_blocks.span('size', bounded=True)})",
                {"t": tenant, "s": sid, "after": old, "hi": new},
            ).fetchone()
            events, size = s["unread_events"] - n, s["unread_bytes"] - b
        else:
            events, size = conn.execute(
                f"SELECT count(*), coalesce(sum(size), 0) FROM ({event_blocks.span('size')})",
                {"t": tenant, "s": sid, "after": new},
            ).fetchone()
        conn.execute(
            "UPDATE streams SET min_ack=?, unread_events=?, unread_bytes=? WHERE tenant_id=? AND sid=?",
            (new, events, size, tenant, sid),
        )

    @retry_reads
    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]:
        def run() -> list[ConsumerInfo]:
            rows = self._rconn().execute(
                "SELECT c.consumer_id, c.acked, c.created_at, c.updated_at FROM consumers c"
                " JOIN streams s ON s.tenant_id = c.tenant_id AND s.sid = c.sid"
                " WHERE s.tenant_id=? AND s.path=? ORDER BY c.consumer_id",
                (tenant, path),
            ).fetchall()
            return [consumer_from_row(r) for r in rows]

        return await self._read(run)

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool:
        def run() -> bool:
            with self._transaction() as conn:
                s = self._stream_row(conn, tenant, path)
                if s is None:
                    return False
                cur = conn.execute(
                    "DELETE FROM consumers WHERE tenant_id=? AND sid=? AND consumer_id=?",
                    (tenant, s["sid"], consumer_id),
                )
                if cur.rowcount:
                    self._recount_unread(conn, tenant, s)
                return cur.rowcount > 0

        return await self._write(run)

    # --- large objects ------------------------------------------------------

    def _object_file(self, tenant: str, sid: int, object_id: str) -> Path:
        return self.path.parent / "objects" / tenant / str(sid) / object_id

    # --- the deletion outbox (migration 0007) ---------------------------------
    # Object bytes are files: the rows that delete objects queue their files
    # in the same transaction, and the files go after the commit.

    @staticmethod
    def _queue_deletions(conn: sqlite3.Connection, objects: list[tuple[str, int, str]]) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO object_deletions VALUES (?, ?, ?, ?)",
            [(tenant, sid, object_id, now_ms()) for tenant, sid, object_id in objects],
        )

    def _drain_deletions(self) -> int:
        """Delete the queued files, then their rows (writer thread)."""
        conn = self._wconn
        assert conn is not None
        queued = conn.execute("SELECT tenant_id, sid, object_id FROM object_deletions").fetchall()
        for tenant, sid, object_id in queued:
            target = self._object_file(tenant, sid, object_id)
            target.unlink(missing_ok=True)
            target.with_suffix(".part").unlink(missing_ok=True)
            with suppress(OSError):
                target.parent.rmdir()  # only when empty
            with self._transaction() as conn:
                conn.execute(
                    "DELETE FROM object_deletions WHERE tenant_id=? AND sid=? AND object_id=?",
                    (tenant, sid, object_id),
                )
        return len(queued)

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        def run() -> None:
            with self._transaction() as conn:
                s = self._stream_row(conn, tenant, path)
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

        await self._write(run)

    @retry_reads
    async def gaps(self, tenant: str, path: str, limit: int) -> list[GapEvidence]:
        rows = await self._read(lambda: self._rconn().execute(
            "SELECT g.first_seq, g.last_seq, g.cause, g.detected_at, g.process FROM gap_evidence g"
            " JOIN streams s ON s.tenant_id = g.tenant_id AND s.sid = g.sid"
            " WHERE s.tenant_id=? AND s.path=? ORDER BY g.detected_at DESC, g.first_seq DESC LIMIT ?",
            (tenant, path, limit),
        ).fetchall())
        return [GapEvidence(*r) for r in rows]

    async def pending_deletions(self) -> int:
        """Object files queued for deletion and not deleted yet."""
        return await self._read(
            lambda: self._rconn().execute("SELECT count(*) FROM object_deletions").fetchone()[0]
        )

    def _object_row(self, conn: sqlite3.Connection, tenant: str, path: str, object_id: str) -> Any:
        return conn.execute(OBJECT_SELECT, (tenant, path, object_id)).fetchone()

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        def run() -> ObjectInfo:
            with self._transaction() as conn:
                s, _ = self._ensure_stream(conn, tenant, path, new_stream_id, now)
                if s["closed"]:
                    row = conn.execute(
                        f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=? AND sid=? AND idempotency_key=?",
                        (tenant, s["sid"], key),
                    ).fetchone()
                    if row is None:  # a closed stream takes no new object; a retry finds its own
                        raise errors.StreamClosed(f"stream {path} is closed", path=path)
                    return object_from_row(path, row)
                conn.execute(
                    "INSERT INTO objects (tenant_id, sid, object_id, idempotency_key, sha256, size,"
                    " content_type, state, created_at, expires_at, schema_ref, auth_receipt)"
                    " VALUES (?,?,?,?,?,?,?, 'prepared', ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (tenant, s["sid"], object_id, key, sha256, size, content_type, now, expires_at, schema,
                     None if authorization is None else orjson.dumps(authorization).decode()),
                )
                row = conn.execute(
                    f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=? AND sid=? AND idempotency_key=?",
                    (tenant, s["sid"], key),
                ).fetchone()
            return object_from_row(path, row)

        return await self._write(run)

    async def upload_object(self, tenant: str, path: str, object_id: str, data: bytes) -> ObjectInfo:
        def run() -> ObjectInfo:
            conn = self._wconn
            assert conn is not None
            row = self._object_row(conn, tenant, path, object_id)
            if row is None:
                raise errors.ObjectNotFound(f"no object {object_id}", object_id=object_id)
            info = object_from_row(path, row)
            if row["closed"] and info.state != "committed":
                raise errors.StreamClosed(f"stream {path} is closed", path=path)
            if info.state in ("uploaded", "committed"):
                return info  # a retried upload of the same bytes
            if info.state != "prepared":
                raise errors.ObjectStateConflict(f"object {object_id} is {info.state}", state=info.state)
            check_object_bytes(info, data)
            target = self._object_file(tenant, row["sid"], object_id)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".part")
            with open(partial, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
            with self._transaction() as conn:
                conn.execute(
                    "UPDATE objects SET state='uploaded' WHERE tenant_id=? AND sid=? AND object_id=?"
                    " AND state='prepared'",
                    (tenant, row["sid"], object_id),
                )
            return replace(info, state="uploaded")

        return await self._write(run)

    @retry_reads
    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        def run() -> ObjectInfo | None:
            row = self._object_row(self._rconn(), tenant, path, object_id)
            return object_from_row(path, row) if row else None

        return await self._read(run)

    @retry_reads
    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        def run() -> bytes | None:
            row = self._object_row(self._rconn(), tenant, path, object_id)
            if row is None or row["state"] != "committed":
                return None
            return self._object_file(tenant, row["sid"], object_id).read_bytes()

        return await self._read(run)

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        def run() -> ObjectInfo | None:
            with self._transaction() as conn:
                row = self._object_row(conn, tenant, path, object_id)
                if row is None:
                    return None
                info = object_from_row(path, row)
                if info.state == "committed":
                    raise errors.ObjectStateConflict(f"object {object_id} is committed", state="committed")
                conn.execute(
                    "UPDATE objects SET state='aborted' WHERE tenant_id=? AND sid=? AND object_id=?",
                    (tenant, row["sid"], object_id),
                )
            return replace(info, state="aborted")

        return await self._write(run)

    async def cleanup_objects(self, now: int) -> int:
        def run() -> int:
            conn = self._wconn
            assert conn is not None
            doomed = conn.execute(
                "SELECT o.tenant_id, o.sid, o.object_id FROM objects o"
                " JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
                " WHERE s.legal_hold = 0 AND o.state != 'committed'"
                " AND (o.state = 'aborted' OR o.expires_at < ?)",
                (now,),
            ).fetchall()
            self._drain_deletions()  # what a crash left queued
            for tenant, sid, object_id in doomed:
                with self._transaction() as conn:
                    gone = conn.execute(
                        "DELETE FROM objects WHERE tenant_id=? AND sid=? AND object_id=?"
                        " AND state != 'committed'",
                        (tenant, sid, object_id),
                    ).rowcount
                    if gone:
                        self._queue_deletions(conn, [(tenant, sid, object_id)])
            self._drain_deletions()
            return len(doomed)

        return await self._write(run)

    # --- tokens --------------------------------------------------------------

    async def create_token(self, token: TokenInfo) -> None:
        def run() -> None:
            with self._transaction() as conn:
                conn.execute(
                    f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                    (
                        token.token_id, token.tenant, token.name, ",".join(token.scopes),
                        token.secret_hash, token.created_at, token.revoked_at,
                    ),
                )

        await self._write(run)

    @retry_reads
    async def find_token(self, token_id: str) -> TokenInfo | None:
        def run() -> TokenInfo | None:
            row = self._rconn().execute(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE token_id=?", (token_id,)
            ).fetchone()
            return token_from_row(row) if row else None

        return await self._read(run)

    @retry_reads
    async def list_tokens(self, tenant: str) -> list[TokenInfo]:
        def run() -> list[TokenInfo]:
            rows = self._rconn().execute(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id=? ORDER BY created_at, token_id",
                (tenant,),
            ).fetchall()
            return [token_from_row(r) for r in rows]

        return await self._read(run)

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool:
        def run() -> bool:
            with self._transaction() as conn:
                cur = conn.execute(
                    "UPDATE tokens SET revoked_at=? WHERE tenant_id=? AND token_id=? AND revoked_at IS NULL",
                    (now, tenant, token_id),
                )
                return cur.rowcount > 0

        return await self._write(run)

    # --- reads ---------------------------------------------------------------

    def _info(self, conn: sqlite3.Connection, tenant: str, path: str) -> StreamInfo | None:
        row = conn.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
        ).fetchone()
        return stream_from_row(row) if row else None

    @retry_reads
    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        return await self._read(lambda: self._info(self._rconn(), tenant, path))

    @retry_reads
    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._read(self._read_range, tenant, path, after, limit, max_bytes, False)

    @retry_reads
    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._read(self._read_range, tenant, path, after, limit, max_bytes, True)

    @retry_reads
    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        return await self._read(self._read_payloads, tenant, path, after, limit, max_bytes, type)

    def _read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        def joined(conn: sqlite3.Connection, stream: tuple[Any, ...]) -> PayloadPage | None:
            sid, head, _, closed = stream[:4]
            count, size, others, seqs, body = conn.execute(
                PAYLOAD_PAGE, {"type": type, "t": tenant, "s": sid, "after": after, "n": limit}
            ).fetchone()
            if others or size > max_bytes:
                return None
            offsets = list(map(int, seqs.split(","))) if count else []
            if any(a >= b for a, b in zip(offsets, offsets[1:])):
                return None
            return PayloadPage(head, bool(closed), offsets[-1] if offsets else None, body)

        return self._in_snapshot(tenant, path, joined)

    @retry_reads
    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        def take(conn: sqlite3.Connection, sid: int, head: int) -> tuple[list[Any], list[int], bool]:
            return self._stepped(conn, tenant, path, sid, offset - 1, offset, None, None, event_from_row, EVENT_COLUMNS)

        return await self._read(self._read_snapshot, tenant, path, take)

    def _read_range(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None, stored: bool
    ) -> ReadPage:
        """Events after ``after`` (``read``, or ``read_stored``: StoredEvents).

        A page of more than STEPPED_ROWS is built by SQLite as one JSON
        array, in one row: the sqlite3 module lets go of the GIL around every
        row it steps, and a reader thread then waits for the event loop's
        thread to hand it back, row after row (with the loop busy, up to the
        interpreter's switch interval each: seconds for a page of 1,000
        rows). A short page (a tail near the head) is stepped: one row
        costs 0.03 ms that way and 0.18 ms as an aggregate; so is a page
        without a byte cap (ONE_ROW_MAX_BYTES)."""
        make = stored_event_from_row if stored else event_from_row
        columns = STORED_COLUMNS if stored else EVENT_COLUMNS

        def take(conn: sqlite3.Connection, sid: int, head: int) -> tuple[list[Any], list[int], bool]:
            long_page = min(limit, head - after) > STEPPED_ROWS
            if long_page and max_bytes is not None and max_bytes <= ONE_ROW_MAX_BYTES:
                taken = self._page_in_one_row(conn, tenant, path, sid, after, limit, max_bytes, stored)
                if taken is not None:
                    return taken
            return self._stepped(conn, tenant, path, sid, after, None, limit, max_bytes, make, columns)

        return self._read_snapshot(tenant, path, take)

    def _in_snapshot(
        self, tenant: str, path: str, fn: Callable[[sqlite3.Connection, tuple[Any, ...]], T]
    ) -> T | None:
        """``fn(conn, stream)`` in one read transaction, ``stream`` the
        stream's READ_STREAM row; None when there is no stream at the path."""
        conn = self._rconn()
        conn.execute("BEGIN")
        try:
            row = conn.execute(READ_STREAM, (tenant, path)).fetchone()
            return None if row is None else fn(conn, row)
        finally:
            conn.execute("COMMIT")

    def _read_snapshot(
        self, tenant: str, path: str,
        take: Callable[[sqlite3.Connection, int, int], tuple[list[Any], list[int], bool]],
    ) -> ReadPage:
        """The stream row and the events ``take(conn, sid, head)`` reads, in one read transaction."""

        def page(conn: sqlite3.Connection, stream: tuple[Any, ...]) -> ReadPage:
            sid, head, pruned_through, closed, stream_id, created_at = stream
            events, sizes, capped = take(conn, sid, head)
            return ReadPage(
                exists=True, head=head, pruned_through=pruned_through, events=events, closed=bool(closed),
                sizes=sizes, capped=capped, stream_id=stream_id, created_at=created_at,
            )

        found = self._in_snapshot(tenant, path, page)
        return found if found is not None else ReadPage(exists=False, head=0, pruned_through=0, events=[])

    @staticmethod
    def _page_in_one_row(
        conn: sqlite3.Connection, tenant: str, path: str, sid: int, after: int, limit: int,
        max_bytes: int | None, stored: bool,
    ) -> tuple[list[Any], list[int], bool] | None:
        counted, kept = conn.execute(
            STORED_PAGE if stored else EVENT_PAGE,
            {"t": tenant, "s": sid, "after": after, "n": limit, "cap": NO_CAP if max_bytes is None else max_bytes},
        ).fetchone()
        items = orjson.loads(kept) if kept else []
        if any(a[0] >= b[0] for a, b in zip(items, items[1:])):
            # SQLite (before 3.44) does not promise the aggregate's order; it
            # keeps the subquery's in practice. Were it not to: step the rows.
            return None
        make = stored_event_from_row if stored else event_from_row
        events = [make(tenant, path, i, None if i[12] is None else bytes.fromhex(i[12])) for i in items]
        return events, [i[11] for i in items], len(items) < counted

    @staticmethod
    def _stepped(
        conn: sqlite3.Connection, tenant: str, path: str, sid: int, after: int, hi: int | None, limit: int | None,
        max_bytes: int | None, make: Callable[..., Any], columns: str,
    ) -> tuple[list[Any], list[int], bool]:
        """The rows after offset ``after`` (through ``hi``), at most ``limit``,
        one at a time: past the byte cap, none is fetched but the first."""
        events: list[Any] = []
        sizes: list[int] = []
        total = 0
        capped = False
        sql = event_blocks.span(f"{columns}, size, data", bounded=hi is not None)
        rows = conn.execute(
            sql if limit is None else sql + " LIMIT :n", {"t": tenant, "s": sid, "after": after, "hi": hi, "n": limit}
        )
        try:
            for r in rows:
                size = r[11]
                if max_bytes is not None and events and total + size > max_bytes:
                    capped = True
                    break
                total += size
                events.append(make(tenant, path, r, r[12]))
                sizes.append(size)
        finally:
            rows.close()
        return events, sizes, capped

    @retry_reads
    async def stream_totals(self, tenant: str) -> StreamTotals:
        def run() -> StreamTotals:
            row = self._rconn().execute(
                "SELECT count(*), coalesce(sum(head), 0) FROM streams WHERE tenant_id=?", (tenant,)
            ).fetchone()
            return StreamTotals(row[0], row[1])

        return await self._read(run)

    @retry_reads
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
