"""SQLite's connection and transaction primitives: one writer thread, a few
reader threads, and the writer's group commit.

All writes go through one writer thread (SQLite allows one writer; a single
thread makes that explicit and keeps transactions short). Reads run on a
small pool of reader threads with their own connections; in WAL mode they
never block the writer and the writer never blocks them. ``synchronous=FULL``
makes every commit durable before it returns.

Every part of the SQLite store (streams, reads, consumers, objects, tokens,
actors, subscriptions, Durable Streams, the outbox) receives the one
``SqliteDb`` and works through these methods; none holds a connection of its
own.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ... import errors
from ...clock import SYSTEM, Clock, wall_ms
from ...files import private_dir, private_file
from ..faults import unavailable
from ..schema import Status, check_recorded, check_startable
from ..schema import status as schema_status
from .group_writes import GroupWrites
from .migrate import migrate, migration_status, migrations, recorded

T = TypeVar("T")

# The page size of a new database file. Event rows are a few hundred bytes:
# 8 KiB pages halve the WAL frames (one write call each) a commit writes;
# batch appends took 8-10% less CPU, single appends the same (measured when
# the events table was WITHOUT ROWID, before migration 0013).
PAGE_SIZE = 8192
# How many stream rows the writer keeps copies of (see SqliteDb._stream_rows).
STREAM_ROWS_KEPT = 4096

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

# A job of a group commit: what it does in the group's transaction.
Job = Callable[[sqlite3.Connection], Any]


def _fault(exc: sqlite3.Error) -> errors.Unavailable | None:
    """``Unavailable`` for a fault of the database file; None for a real SQL error."""
    code = getattr(exc, "sqlite_errorcode", None)
    found = _FAULTS.get(code & 0xFF) if isinstance(code, int) else None
    if found is None:
        return None
    fault = unavailable(*found)
    fault.__cause__ = exc
    return fault


def _settle_commits(
    jobs: Sequence[tuple[asyncio.Future[Any], Job, bool]], outcomes: Sequence[tuple[bool, Any]]
) -> None:
    for (future, _, _), (ok, value) in zip(jobs, outcomes, strict=True):
        if future.done():  # the caller was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception((_fault(value) or value) if isinstance(value, sqlite3.Error) else value)


def path_from_url(url: str) -> Path:
    """``sqlite:///relative/or/abs.db`` → Path (``sqlite:////abs`` also works)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    return Path(url[len("sqlite:///") :])


def file_migration_status(url: str) -> Status:
    """``migration_status`` of the file at ``url``, opened read-only (a
    missing file: every migration pending)."""
    path = path_from_url(url)
    if not path.exists():
        return schema_status({}, migrations())
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return migration_status(conn)
    finally:
        conn.close()


class _OneCommitRaised(Exception):
    """A commit of a group run without savepoints raised: run the group again, isolated."""


class SqliteDb:
    """The file's connections: the writer thread and its connection, the
    reader threads and theirs, and the writer's group commit."""

    def __init__(self, path: Path, *, readers: int = 2, migrate: bool = True, clock: Clock = SYSTEM) -> None:
        self.path = path
        # The runtime's clock: the times the parts stamp themselves (facts,
        # leases, heartbeats; SQLite is one machine, so one clock) follow it.
        self.clock = clock
        self.migrate = migrate  # False: --no-migrate (pending migrations refuse the start)
        self._readers = readers
        self._writer: ThreadPoolExecutor | None = None
        # Jobs waiting for the writer thread's next group commit (under
        # _lock), and whether a _commit_waiting job is queued to take them.
        self._commits: list[tuple[asyncio.Future[Any], Job, bool]] = []
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
        self._others_version: int | None = None  # others_committed's last look

    def now_ms(self) -> int:
        """The clock's wall time in milliseconds, as the tables keep it."""
        return wall_ms(self.clock)

    # --- lifecycle ----------------------------------------------------------

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, cached_statements=256)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only; an existing one keeps its own
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    async def open(self) -> None:
        private_dir(self.path.parent)
        private_file(self.path)  # 0600, and so its -wal and -shm (files.py)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="yoke-sqlite-writer")
        self._reader_pool = ThreadPoolExecutor(self._readers, thread_name_prefix="yoke-sqlite-reader")
        await self.write(self._open_writer)

    def _open_writer(self) -> None:
        self._wconn = self.connect()
        if self.migrate:
            migrate(self._wconn, self.now_ms)
        else:
            check_startable(migration_status(self._wconn), migrated=False)
        self._others_version = self._wconn.execute("PRAGMA data_version").fetchone()[0]

    async def close(self) -> None:
        if self._writer is None:
            return
        await self.write(lambda: self._wconn.close() if self._wconn else None)
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
            conn = self.reader()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            files = migrations()
            check_recorded(recorded(conn), files)
            if version < files[-1].version:
                raise errors.YokeError(f"schema version {version}, expected {files[-1].version}")

        await self.read(check)

    async def schema_version(self) -> int:
        return await self.read(lambda: int(self.reader().execute("PRAGMA user_version").fetchone()[0]))

    async def others_committed(self) -> bool:
        """Whether another process committed to the file since the last call
        (the writer connection's PRAGMA data_version moves only for other
        connections' commits; this process's readers never write): SQLite
        has no notifications between processes."""
        def check() -> bool:
            assert self._wconn is not None
            version = self._wconn.execute("PRAGMA data_version").fetchone()[0]
            changed, self._others_version = version != self._others_version, version
            return changed

        return await self.write(check, streams_unchanged=True)

    # --- the writer and the readers -----------------------------------------

    async def write(self, fn: Callable[..., T], *args: Any, streams_unchanged: bool = False) -> T:
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

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a reader thread (``reader()`` is its connection)."""
        if self._reader_pool is None:
            raise errors.RuntimeClosed("the store is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reader_pool, fn, *args)
        except sqlite3.Error as exc:
            raise _fault(exc) or exc

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """One statement's rows, read on a reader thread."""
        return await self.read(lambda: self.reader().execute(sql, params).fetchall())

    def reader(self) -> sqlite3.Connection:
        """The calling reader thread's connection (read-only)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connect()
            conn.execute("PRAGMA query_only=1")
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    @property
    def writer(self) -> sqlite3.Connection:
        """The writer thread's connection (on the writer thread only)."""
        conn = self._wconn
        assert conn is not None
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
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

    # --- group commit ----------------------------------------------------------

    async def grouped(self, job: Job, *, repeatable: bool = False) -> Any:
        """``job(conn)`` in the writer's next group commit: the jobs waiting
        together share one transaction. ``repeatable``: the job may run
        twice (a commit: its Python side has no effect of its own), so the
        group runs without savepoints first; any other job isolates its
        group at once, and its exception rolls back its writes alone."""
        if self._writer is None:
            raise errors.RuntimeClosed("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._commits.append((future, job, repeatable))
            start, self._commits_queued = not self._commits_queued, True
        if start:
            try:
                self._writer.submit(self._commit_waiting, loop)
            except RuntimeError:  # the writer shut down meanwhile
                with self._lock:
                    waiting, self._commits, self._commits_queued = self._commits, [], False
                for f, _, _ in waiting:
                    if not f.done():
                        f.set_exception(errors.RuntimeClosed("the store is closed"))
        return await future

    def _commit_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread: every job waiting (appends to different
        streams come as separate commits) in one transaction, so that one
        fsync and one handoff to the event loop serve them all. They run
        without savepoints first (two statements fewer per commit, each a GIL
        hand-back); when one raises, the transaction is rolled back and the
        group runs again with a savepoint per job, so that one rolls back
        alone. A failed COMMIT fails them all (nothing was written)."""
        with self._lock:
            jobs, self._commits, self._commits_queued = self._commits, [], False
        conn = self._wconn
        try:
            if conn is None:
                raise errors.RuntimeClosed("the store is closed")
            try:
                # A job that is not repeatable is not run twice (its Python
                # side may not be repeatable): a group holding one is isolated at once.
                isolated = not all(repeatable for _, _, repeatable in jobs)
                outcomes = self._commit_group(conn, jobs, isolated=isolated)
            except _OneCommitRaised:
                outcomes = self._commit_group(conn, jobs, isolated=True)
        except Exception as exc:
            if isinstance(exc, sqlite3.ProgrammingError):  # the connection was closed
                exc = errors.RuntimeClosed("the store is closed")
            outcomes = [(False, exc)] * len(jobs)
        loop.call_soon_threadsafe(_settle_commits, jobs, outcomes)

    def _commit_group(
        self, conn: sqlite3.Connection, jobs: list[tuple[asyncio.Future[Any], Job, bool]],
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
            for future, job, _ in jobs:
                if future.done():  # its caller was cancelled before the writer got to it
                    outcomes.append((False, None))
                    continue
                if isolated:
                    conn.execute("SAVEPOINT yoke_commit")
                try:
                    outcomes.append((True, job(conn)))
                except Exception as exc:
                    if not conn.in_transaction:
                        raise  # SQLite rolled the whole transaction back (disk full, I/O): all fail
                    if not isolated:
                        raise _OneCommitRaised from exc
                    conn.execute("ROLLBACK TO yoke_commit")
                    outcomes.append((False, exc))
                if isolated:
                    conn.execute("RELEASE yoke_commit")
            self.write_held(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._stream_rows.clear()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            self._held = None
        return outcomes

    @property
    def held(self) -> GroupWrites | None:
        """What the running group holds back to its end (None: write at once)."""
        return self._held

    def write_held(self, conn: sqlite3.Connection) -> None:
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

    # --- the writer's copies of stream rows (groups without savepoints) -----

    def kept_row(self, tenant: str, path: str) -> dict[str, Any] | None:
        """The writer's copy of the stream's row, in a group that holds its
        writes back (None otherwise, or when there is none)."""
        return self._stream_rows.get((tenant, path)) if self._held is not None else None

    def keep_row(self, tenant: str, path: str, row: sqlite3.Row) -> None:
        """Keep a copy of the row just read, in a group that holds its writes back."""
        if self._held is not None:
            self._stream_rows[(tenant, path)] = dict(row)

    def row_changed(self, tenant: str, path: str) -> None:
        """A job in a group changed its stream's row other than by appending."""
        self._stream_rows.pop((tenant, path), None)
