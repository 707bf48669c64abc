"""Per-instance SQLite databases: ``ctx.state`` and ``ctx.sqlite``.

Each instance has one SQLite database. ``ctx.state`` is a JSON document with
a version in the table ``_yoke_state``; ``ctx.sqlite`` runs the caller's SQL
on the same database. Where the database lives is the storage mode
(``YOKE_STORAGE``):

- ``file``: one SQLite file per instance under ``<data dir>/actors/`` (the
  embedded default), durable at each commit (``synchronous=FULL``);
- ``pg_sqlite``: the serialized database as BYTEA in ``actor_sqlite``,
  written after each write (the PostgreSQL default);
- ``s3``: a file per instance in an S3 bucket with a local cache
  (``actors/storage_s3.py``).

SQLite work runs on a small thread pool; one operation at a time per
instance (an asyncio lock), so a connection is never used by two threads
at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import resource
import secrets
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from .. import errors
from ..clock import SYSTEM, Clock, wall_ms
from ..events import MAX_DEPTH, json_text
from ..files import private_dir
from ..store.actors import ActorStore
from ..store.catalogue import InstanceRows, QueryResult, bounded_sqlite_query
from . import crash_points
from .state_capture import SEQ_SCHEMA, SEQ_TABLE, Capture

T = TypeVar("T")
log = logging.getLogger("yoke.actors.state")

STATE_TABLE = "_yoke_state"
# Atomic runs (actors/atomic.py): the queue rows whose run committed here,
# with the effects the store has still to perform.
APPLIED_TABLE = "_yoke_applied"
APPLIED_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} ("
    " qid INTEGER PRIMARY KEY, effects TEXT NOT NULL, at INTEGER NOT NULL)"
)
# How deep an applied marker nests a record's document: the marker, its
# records, a record, a schedule, its event (the deepest; then the payload).
MARKER_WRAPPING = 5
SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), value TEXT NOT NULL, version INTEGER NOT NULL)"
)
MAX_QUERY_ROWS = 10_000  # rows one read-only query answers
MAX_QUERY_S = 30.0  # seconds one read-only query may run
# Statements that only read; anything else counts as a write to persist.
_READ_ONLY = re.compile(r"\s*(SELECT|WITH|EXPLAIN|PRAGMA\s+\w+\s*$)", re.IGNORECASE)


class StateStorage(Protocol):
    """Where per-instance databases are kept."""

    def open(self, tenant: str, instance_id: str) -> sqlite3.Connection:
        """A connection to the instance's database, loaded when needed (worker thread)."""

    def persist(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> Callable[[], Any] | None:
        """After a write (worker thread). May return a coroutine function to
        await on the event loop (a database or network write)."""

    # Atomic runs: True when the database's durable copy is a store row that
    # the run's store transaction writes itself (pg_sqlite); otherwise the
    # commit marks the database first (actors/atomic.py).
    in_store: bool

    def durable(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> Callable[[], Any] | None:
        """After an atomic run's commit (worker thread): what makes the
        committed database durable before the run's store transaction; like
        ``persist``'s answer, awaited on the event loop."""

    async def close(self) -> None: ...


def _configure(conn: sqlite3.Connection) -> sqlite3.Connection:
    # A read where the table exists: a process reading a database another
    # one owns and writes takes no write lock here.
    conn.execute(SCHEMA)
    return conn


@functools.cache
def _template() -> bytes:
    """A new instance database's file, made once: the kernel's tables, in
    WAL mode (the file format's versions 2)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        _configure(conn)
        conn.execute(SEQ_SCHEMA)  # the SQL catalogue's change counter (state_capture.py)
        conn.execute(f"INSERT INTO {SEQ_TABLE} VALUES (1, 0)")
        image = bytearray(conn.serialize())
    finally:
        conn.close()
    image[18] = image[19] = 2
    return bytes(image)


def _create_from_template(path: Path) -> bool:
    """Make a new database at ``path`` (mode 0600, and so its -wal and -shm)
    from the template; False when it exists. One write and one fsync:
    SQLite making the file itself (its switch to WAL through a rollback
    journal's transaction, then the schema) took eight fsyncs and several
    milliseconds of CPU, the most of a new keyed instance's cost. Written
    and synced under a name of its own, then linked into place whole: a
    crash leaves no part of a file, and a WAL is never beside a file not
    yet synced (SQLite deletes a WAL next to an empty file when it opens)."""
    if path.exists():
        return False
    new = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have taken bits off: be exact
        data = memoryview(_template())
        while data:
            data = data[os.write(fd, data):]
        os.fdatasync(fd)
        os.close(fd)
        fd = -1
        os.link(new, path)
    except FileExistsError:  # made meanwhile (by a database opened elsewhere)
        return False
    finally:
        if fd >= 0:
            os.close(fd)
        new.unlink(missing_ok=True)
    return True


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part)


class FileStorage:
    in_store = False

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def root_in(data_dir: str) -> Path:
        """Where the instance databases of ``data_dir`` live (yoke backup copies them)."""
        return Path(data_dir) / "actors"

    def path(self, tenant: str, instance_id: str) -> Path:
        return self.root / _safe(tenant) / f"{_safe(instance_id)}.db"

    def open(self, tenant: str, instance_id: str) -> sqlite3.Connection:
        path = self.path(tenant, instance_id)
        private_dir(path.parent)
        created = _create_from_template(path)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")  # (a file from the template is in WAL mode already)
        if not created:
            # A file SQLite made (an older build's; or empty, left by a crash
            # before its first commit) may lack the state's table: made
            # without waiting for the disk (lost in a crash, the next open
            # makes it again, and the first durable commit after it syncs
            # the WAL it is in).
            conn.execute("PRAGMA synchronous=OFF")
            _configure(conn)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def persist(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> None:
        return None  # committed to the file already

    def durable(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> None:
        return None  # synchronous=FULL: a commit is durable

    async def close(self) -> None:
        return None


class PgSqliteStorage:
    """The database runs in memory; its serialized image is the durable copy."""

    in_store = True

    def __init__(self, store: ActorStore, loop: asyncio.AbstractEventLoop, clock: Clock = SYSTEM) -> None:
        self._clock = clock  # when an image was saved
        self._store = store
        self._loop = loop

    def open(self, tenant: str, instance_id: str) -> sqlite3.Connection:
        image = asyncio.run_coroutine_threadsafe(
            self._store.load_state(tenant, instance_id), self._loop
        ).result()
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        if image:
            conn.deserialize(image)
        return _configure(conn)

    def persist(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> Callable[[], Any]:
        image = conn.serialize()
        return lambda: self._store.save_state(tenant, instance_id, image, wall_ms(self._clock))

    def durable(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> None:
        return None  # the run's store transaction writes the image

    async def close(self) -> None:
        return None


class DatabaseClosed(errors.YokeError):
    """The instance's database was closed under the operation (the instance
    moved to another worker): an atomic run fails and its row runs again; a
    read through the API is answered 503 and may be retried."""

    code = "instance_moved"
    http_status = 503


class InstanceDatabase:
    """One instance's database; every method is one locked operation."""

    def __init__(self, owner: StateDatabases, tenant: str, instance_id: str) -> None:
        self._owner = owner
        self.tenant = tenant
        self.instance_id = instance_id
        self._conn: sqlite3.Connection | None = None
        self.slot = False  # counted in its owner's bound (StateDatabases.take_slot)
        self._lock = asyncio.Lock()
        # Closed by its owner (forget, remove): no operation reopens it, so
        # an atomic run holding it fails rather than write around its
        # transaction. The thread lock keeps close() off a running operation.
        self.closed = False
        self._conn_guard = threading.Lock()
        # Serializes ctx.state.update calls of this process (the compare-and-
        # set still guards against every other writer): N concurrent
        # updaters then cost N round trips, not N squared.
        self.update_lock = asyncio.Lock()
        # An atomic run holds the database from its start to its commit, its
        # writes in one open transaction (actors/atomic.py); readers from
        # outside the run (the API) wait for it.
        self.run_lock = asyncio.Lock()
        self._in_run = False
        self._run_wrote = False
        self._applied_done: list[int] = []  # markers whose store transaction committed
        # The rows its operations change, for the SQL catalogue's mirror
        # (None: not mirrored from here, as a copy opened only to read).
        self.capture: Capture | None = None
        self.ops = 0  # operations run (but the mirror's reads): what a read at a run's end checks

    async def _run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool | None | Callable[[T], bool],
        notify: bool = True,
    ) -> T:
        """Run ``fn`` on the connection. ``write``: True persists afterwards,
        False never, None when rows changed, a callable decides from the result."""
        if not self.slot:
            await self._owner.room_for(self)
        self._owner.used(self)
        try:
            return await self._locked_run(fn, write, notify)
        finally:
            self._owner.ended()

    async def _locked_run(
        self, fn: Callable[[sqlite3.Connection], T], write: bool | None | Callable[[T], bool], notify: bool
    ) -> T:
        async with self._lock:
            loop = asyncio.get_running_loop()

            wrote = [False]  # the operation wrote (rows, or the schema alone)

            def work() -> tuple[T, Callable[[], Any] | None]:
                with self._conn_guard:
                    return locked_work()

            def locked_work() -> tuple[T, Callable[[], Any] | None]:
                if self.closed:
                    raise DatabaseClosed(
                        f"the database of instance {self.instance_id} was closed: it moved to another worker"
                    )
                if self._conn is None:
                    conn = self._owner.storage.open(self.tenant, self.instance_id)
                    if self.capture is not None:
                        try:
                            self.capture.attach(conn)
                        except BaseException:  # never a connection whose changes go unnoted
                            conn.close()
                            raise
                    self._conn = conn
                    self._owner.take_slot(self)
                before = self._conn.total_changes
                if notify:
                    self.ops += 1
                result = fn(self._conn)
                # Rows changed (total_changes), or a statement that may change
                # the file without counting (DDL, COMMIT): persist.
                changed = (write(result) if callable(write) else write) or (
                    write is not False and self._conn.total_changes != before
                )
                if changed and self._in_run:  # persisted by the run's commit
                    self._run_wrote, changed = True, False
                    wrote[0] = True
                after = (
                    self._owner.storage.persist(self.tenant, self.instance_id, self._conn)
                    if changed else None
                )
                wrote[0] = wrote[0] or changed
                if wrote[0] and self.capture is not None:
                    self.capture.wrote = True  # (a schema change notes no row: collect looks)
                return result, after

            done = loop.run_in_executor(self._owner.pool, work)
            try:
                result, after = await asyncio.shield(done)
            except asyncio.CancelledError:
                # The thread goes on regardless: hold the lock until it ends,
                # so nothing else (a reload, a rollback) runs on the
                # connection meanwhile.
                await _finish(done)
                raise
            if after is not None:
                await after()
            if notify and self.capture is not None and (wrote[0] or self.capture.noted or self.capture.opened):
                self._owner.changed(self)  # (a schema change alone notes no row)
            return result

    async def mirror_changes(
        self, *, whole: bool, unless: Callable[[], bool]
    ) -> tuple[InstanceRows | None, bool]:
        """What the SQL catalogue's mirror lacks of this database (None:
        nothing), and whether that is all of it. ``whole``: every table,
        opening the database if need be. A database whose connection closed
        sends what it stashed. When ``unless()`` holds once the operation
        has the database (a run is under way: a query must not see part of
        it), only what was stashed at an earlier run's end: the rest after."""
        capture = self.capture
        if capture is None:
            return None, True
        whole = whole or capture.resend_whole
        if self.closed or (self._conn is None and not whole) or not (whole or capture.noted or capture.wrote):
            return capture.collect(None, whole=False), True

        def collect(conn: sqlite3.Connection) -> tuple[InstanceRows | None, bool]:
            if unless():
                stashed = capture.collect(None, whole=False)
                capture.resend_whole = capture.resend_whole or (whole and not (stashed is not None and stashed.whole))
                return stashed, False
            return capture.collect(conn, whole=whole), True

        try:
            return await self._run(collect, write=False, notify=False)  # (the mirror's own reading)
        except DatabaseClosed:
            return capture.collect(None, whole=False), True

    # --- ctx.state ---------------------------------------------------------

    async def state_get(self) -> tuple[Any, int]:
        def get(conn: sqlite3.Connection) -> tuple[Any, int]:
            row = conn.execute(f"SELECT value, version FROM {STATE_TABLE} WHERE id=1").fetchone()
            return (None, 0) if row is None else (orjson.loads(row[0]), row[1])

        return await self._run(get, write=False)

    async def image(self) -> bytes:
        """The database as one serialized image (a fork's, its diff's), in
        rollback-journal mode: a WAL file's image opens in memory only so."""
        image = bytearray(await self._run(lambda conn: conn.serialize(), write=False))
        if len(image) > 19:
            image[18] = image[19] = 1  # the file format's write and read versions: 2 is WAL
        return bytes(image)

    async def state_set(self, value: Any) -> int:
        text = _dump_state(value)

        def put(conn: sqlite3.Connection) -> int:
            conn.execute(
                f"INSERT INTO {STATE_TABLE} VALUES (1, ?, 1) ON CONFLICT (id)"
                " DO UPDATE SET value=excluded.value, version=version+1",
                (text,),
            )
            return conn.execute(f"SELECT version FROM {STATE_TABLE} WHERE id=1").fetchone()[0]

        return await self._run(put, write=True)

    async def state_cas(self, expected: int, value: Any) -> tuple[bool, int]:
        """Write ``value`` if the version is still ``expected``: (written, version)."""
        text = _dump_state(value)

        def cas(conn: sqlite3.Connection) -> tuple[bool, int]:
            if conn.in_transaction:  # an atomic run's: it is the transaction
                return check_and_set(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = check_and_set(conn)
                conn.execute("COMMIT" if result[0] else "ROLLBACK")
                return result
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        def check_and_set(conn: sqlite3.Connection) -> tuple[bool, int]:
            row = conn.execute(f"SELECT version FROM {STATE_TABLE} WHERE id=1").fetchone()
            current = 0 if row is None else row[0]
            if current != expected:
                return False, current
            conn.execute(
                f"INSERT INTO {STATE_TABLE} VALUES (1, ?, ?) ON CONFLICT (id)"
                " DO UPDATE SET value=excluded.value, version=excluded.version",
                (text, current + 1),
            )
            return True, current + 1

        return await self._run(cas, write=lambda result: result[0])  # a lost race wrote nothing

    # --- ctx.sqlite --------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> dict[str, int]:
        _check_sql(sql)

        def run(conn: sqlite3.Connection) -> dict[str, int]:
            cur = conn.execute(sql, params)
            return {"rowcount": cur.rowcount, "lastrowid": cur.lastrowid or 0}

        return await self._guard(run, write=not _READ_ONLY.match(sql) or None)

    async def query(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> list[dict[str, Any]]:
        _check_sql(sql)

        def run(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            cur = conn.execute(sql, params)
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, row)) for row in cur.fetchall()]

        return await self._guard(run, write=not _READ_ONLY.match(sql) or None)

    async def read_only(
        self, sql: str, params: Sequence[Any], *, max_rows: int, timeout_s: float
    ) -> QueryResult:
        """One statement that only reads (an authorizer refuses anything else,
        ``_yoke_state`` included in what it may read), at most ``max_rows``
        rows and ``timeout_s`` seconds (then ``InvalidInput``: interrupted)."""
        if not isinstance(sql, str) or not sql.strip():
            raise errors.InvalidInput("sql must be a non-empty string", field="sql")

        def run(conn: sqlite3.Connection) -> QueryResult:
            return bounded_sqlite_query(
                conn, sql, params, _read_only_authorizer, max_rows=max_rows, timeout_s=timeout_s
            )

        try:
            return await self._run(run, write=False)
        except (sqlite3.Error, ValueError, OverflowError) as exc:  # ValueError: a NUL in the SQL
            message = "the query ran out of time" if "interrupted" in str(exc) else str(exc)
            raise errors.InvalidInput(f"sqlite: {message}", field="sql") from None

    async def _guard(self, fn: Callable[[sqlite3.Connection], T], *, write: bool | None) -> T:
        try:
            return await self._run(fn, write=write)
        except sqlite3.Error as exc:
            raise errors.InvalidInput(f"sqlite: {exc}", field="sql") from None

    # --- atomic runs (actors/atomic.py) ----------------------------------------

    @property
    def keeps_state_in_store(self) -> bool:
        return self._owner.storage.in_store

    async def begin_run(self) -> None:
        """Hold the database for one atomic run: its writes stay in one open
        transaction (its reads see them) until ``commit_run`` or
        ``rollback_run``; ``end_run`` lets the next run in."""
        await self.run_lock.acquire()
        began = False

        def begin(conn: sqlite3.Connection) -> None:
            nonlocal began
            if conn.in_transaction:  # no run should leave one: nothing of it committed
                log.warning("instance %s: rolled back a transaction an earlier run left open", self.instance_id)
                conn.set_authorizer(None)
                conn.execute("ROLLBACK")
            conn.execute("BEGIN")
            began = True
            conn.set_authorizer(_no_transaction_control)
            crash_points.reached("sqlite_begin")  # test only (on the pool thread)

        try:
            crash_points.reached("begin_run")  # test only
            await self._run(begin, write=False)
            self._in_run, self._run_wrote = True, False
        except BaseException:
            # Cancelled (the run's time ran out) while the thread began the
            # transaction: it ends here, or it would stay open, its
            # authorizer refusing every later run's BEGIN.
            try:
                if began:
                    await _through_cancellation(self._end_transaction())
            finally:
                self.run_lock.release()
            raise

    async def applied(self, qid: int) -> Any:
        """The marker of queue row ``qid``'s atomic run that committed here
        (None: none did)."""
        def find(conn: sqlite3.Connection) -> Any:
            try:
                row = conn.execute(f"SELECT effects FROM {APPLIED_TABLE} WHERE qid=?", (qid,)).fetchone()
            except sqlite3.OperationalError:  # no such table: no atomic run committed here yet
                return None
            return None if row is None else orjson.loads(row[0])

        return await self._run(find, write=False)

    async def commit_run(self, qid: int, marker: Any) -> tuple[bool, bytes | None]:
        """Commit the run's writes: (wrote, image). Nothing written: nothing
        committed. With the database kept in the store (pg_sqlite), the
        image is for the run's store transaction to write. Otherwise the
        commit also records ``qid`` with ``marker`` (JSON: the run's event
        and effects), and is made durable before this returns."""
        storage = self._owner.storage
        done, self._applied_done = self._applied_done, []

        reached = False

        def commit(conn: sqlite3.Connection) -> tuple[bool, Callable[[], Any] | None, bytes | None]:
            nonlocal reached
            reached = True
            conn.set_authorizer(None)
            try:
                return commit_open(conn)
            except BaseException:
                # Nothing of the run committed: its transaction ends with it
                # (left open, the next run's BEGIN would fail, and reads
                # would see the run's writes).
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        def commit_open(conn: sqlite3.Connection) -> tuple[bool, Callable[[], Any] | None, bytes | None]:
            if not self._run_wrote:
                conn.execute("ROLLBACK")
                return False, None, None
            if storage.in_store:
                conn.execute("COMMIT")
                crash_points.reached("sqlite_commit")  # test only (on the pool thread)
                return True, None, conn.serialize()
            conn.execute(APPLIED_SCHEMA)
            conn.executemany(f"DELETE FROM {APPLIED_TABLE} WHERE qid=?", [(q,) for q in done])
            # Checked like any stored document (a value the store cannot
            # take must fail the run here, before its state commits), with
            # room for the marker's own nesting around a payload at the
            # limit: marker, records, record, schedule, event.
            effects = json_text(marker, "effects", depth=MAX_DEPTH + MARKER_WRAPPING)
            applied_at = wall_ms(self._owner.clock)
            conn.execute(f"INSERT INTO {APPLIED_TABLE} VALUES (?, ?, ?)", (qid, effects, applied_at))
            crash_points.reached("applied_marker")  # test only (on the pool thread)
            conn.execute("COMMIT")
            crash_points.reached("sqlite_commit")  # test only (on the pool thread)
            return True, storage.durable(self.tenant, self.instance_id, conn), None

        try:
            wrote, durable, image = await self._run(commit, write=False)
        except BaseException:
            self._applied_done = done + self._applied_done
            if not reached:  # cancelled before the thread took it: the run's transaction is open
                await _through_cancellation(self._end_transaction())
            raise
        finally:
            self._in_run = False
        if durable is not None:
            crash_points.reached("before_upload")  # test only
            await durable()
        return wrote, image

    async def make_durable(self) -> None:
        """What an atomic commit does after its local commit, once more (a
        marker found on a retry: its upload may have failed)."""
        durable = await self._run(
            lambda conn: self._owner.storage.durable(self.tenant, self.instance_id, conn), write=False
        )
        if durable is not None:
            await durable()

    async def rollback_run(self) -> None:
        """Drop the run's writes (a failed or cancelled run)."""
        try:
            if self._in_run:
                await _through_cancellation(self._end_transaction())
        finally:
            self._in_run = False

    async def _end_transaction(self) -> None:
        """Roll back the open transaction of a run, if any, and lift the
        run's authorizer."""
        def rollback(conn: sqlite3.Connection) -> None:
            conn.set_authorizer(None)
            if conn.in_transaction:
                conn.execute("ROLLBACK")

        if self._conn is None:  # dropped (reload, close): its transaction went with it
            return
        try:
            await self._run(rollback, write=False)
        except DatabaseClosed:
            pass  # its transaction went with the connection

    def end_run(self) -> None:
        self.run_lock.release()
        self._owner.ended()  # idle now: an operation waiting for a connection may have this one

    def applied_done(self, qid: int) -> None:
        """Queue row ``qid``'s store transaction committed: its marker goes
        with the next atomic commit (a marker left behind is harmless: a
        queue row id never comes back)."""
        self._applied_done.append(qid)

    async def reload(self) -> None:
        """Drop the open copy: the next operation loads the durable one (an
        atomic run committed here whose store transaction failed)."""
        def drop(conn: sqlite3.Connection) -> None:
            if self.capture is not None:  # what it noted was never stored: the stored copy is sent whole
                self.capture.discard()
            self._close_conn()

        if self._conn is not None and not self.closed:  # closed: nothing to reload
            await self._run(drop, write=False)

    async def release_connection(self) -> bool:
        """Close the connection while the database is idle (no operation, no
        atomic run, no open transaction); the next operation opens it again
        from its storage, where every committed write already is. False
        when it is in use."""
        if self._lock.locked() or self.run_lock.locked() or self._in_run:
            return False
        async with self._lock:
            if self.run_lock.locked() or self._in_run:
                return False

            def shut() -> bool:
                with self._conn_guard:
                    if self._conn is not None and self._conn.in_transaction:
                        return False
                    self._close_conn()
                    return True

            return await asyncio.get_running_loop().run_in_executor(self._owner.pool, shut)

    def close(self) -> None:
        """For good (on a pool thread, after any running operation)."""
        self.closed = True
        with self._conn_guard:
            self._close_conn()

    def _close_conn(self) -> None:
        """Under ``_conn_guard``."""
        if self._conn is not None:
            if self.capture is not None:
                try:
                    self.capture.close(self._conn)
                except Exception:  # its notes are lost: its counter says so at the next open
                    log.exception("instance %s: reading its changed rows failed", self.instance_id)
                if self.capture.pending:
                    self._owner.changed(self)
            self._conn.close()
            self._conn = None
        self._owner.give_slot(self)


async def _finish(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` to end, through any further cancellation."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            pass
    if not future.cancelled():
        future.exception()  # retrieved: the caller is cancelled, nobody else will


async def _through_cancellation(cleanup: Awaitable[Any]) -> None:
    """Run ``cleanup`` to its end even when the caller is cancelled
    meanwhile (a rollback must not stop halfway); the cancellation is
    raised after it."""
    task = asyncio.ensure_future(cleanup)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await _finish(task)
        raise


def _no_transaction_control(action: int, *_: Any) -> int:
    """An atomic run's SQL may not begin, commit or roll back the run's
    transaction (savepoints are fine)."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK


# What a read-only query may do: read tables, call functions, recurse (CTEs),
# and run pragmas that only describe the schema (whatever their argument) or
# read a value (without one: nothing set).
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_SCHEMA_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list",
}
_VALUE_PRAGMAS = {"user_version", "page_count", "page_size"}


def _read_only_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _by: str | None) -> int:
    if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA:
        pragma = (arg1 or "").lower()
        if pragma in _SCHEMA_PRAGMAS or (pragma in _VALUE_PRAGMAS and arg2 is None):
            return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _dump_state(value: Any) -> str:
    return json_text(value, "state")


def check_query(params: Any, max_rows: Any, timeout_s: Any) -> None:
    """A read-only query's params and limits (instances.query, a fork's)."""
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or not 1 <= max_rows <= MAX_QUERY_ROWS:
        raise errors.InvalidInput(f"max_rows must be 1-{MAX_QUERY_ROWS}", field="max_rows")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s <= MAX_QUERY_S:
        raise errors.InvalidInput(f"timeout_s must be more than 0 and at most {MAX_QUERY_S}", field="timeout_s")
    if not isinstance(params, (list, tuple)) or not all(_sql_value(v) for v in params):
        raise errors.InvalidInput(
            "params must be a list of strings, numbers (64-bit integers), booleans or nulls", field="params"
        )


def _sql_value(value: Any) -> bool:
    """A value SQLite can bind."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63
    return value is None or isinstance(value, (bool, float, str))


def _check_sql(sql: str) -> None:
    if not isinstance(sql, str) or not sql.strip():
        raise errors.InvalidInput("sql must be a non-empty string", field="sql")
    lowered = sql.lower()
    if STATE_TABLE in lowered or APPLIED_TABLE in lowered or SEQ_TABLE in lowered or "_yoke_capture" in lowered:
        raise errors.InvalidInput(
            f"{STATE_TABLE}, {APPLIED_TABLE} and {SEQ_TABLE} are reserved for the kernel", field="sql"
        )


OPEN_DATABASES = 1_000  # the default bound of instance databases open at once


def max_open_databases(asked: int = 0) -> int:
    """How many instance databases may hold a connection at once: ``asked``
    (the ``actor_open_databases`` setting; 0: ``OPEN_DATABASES``), within
    what the descriptor limit leaves: a file connection takes three (the
    file, its -wal and -shm), and the process needs others (sockets, the
    store's files)."""
    wanted = asked if asked > 0 else OPEN_DATABASES
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    fit = max(16, (soft - 256) // 4)
    if asked > fit:
        log.warning(
            "actor_open_databases=%d needs %d file descriptors and the limit is %d: %d instance databases stay"
            " open at most (raise the limit: ulimit -n, LimitNOFILE= in a systemd unit)",
            asked, asked * 4 + 256, soft, fit,
        )
    return min(wanted, fit)


class StateDatabases:
    """The per-instance databases of this process.

    Connections are bounded (``max_connections``): past the bound, the
    least recently used idle databases close theirs, and open again on their
    next operation. Without the bound a worker with thousands of keyed
    instances ran out of file descriptors, and runs failed until their rows
    were dead-lettered."""

    def __init__(
        self, storage: StateStorage, threads: int = 4, clock: Clock = SYSTEM, max_connections: int | None = None
    ) -> None:
        self.storage = storage
        self.clock = clock  # the runtime's: when a run's marker was applied
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="yoke-actor-sqlite")
        self._open: dict[tuple[str, str], InstanceDatabase] = {}
        self.max_connections = max_connections or max_open_databases()
        self.connections = 0  # open now (changed on pool threads: under _count_lock)
        self._count_lock = threading.Lock()
        # Databases that may hold a connection, least recently used first.
        self._recent: OrderedDict[tuple[str, str], InstanceDatabase] = OrderedDict()
        self._trimming: asyncio.Task[None] | None = None
        self._op_ended: asyncio.Future[None] | None = None  # what operations waiting for room wait on
        # The SQL catalogue's mirror: who hears of databases with changed
        # rows, and the instances whose run is under way (their changes
        # wait for its end: a query sees a run whole or not at all).
        self._listener: Callable[[InstanceDatabase], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._held: dict[tuple[str, str], int] = {}
        self._reading: set[asyncio.Task[None]] = set()  # reads at runs' ends

    # --- the SQL catalogue's mirror (actors/sql_mirror.py) -------------------

    def mirror_to(self, listener: Callable[[InstanceDatabase], None]) -> None:
        """The databases this process owns note their changed rows;
        ``listener`` hears (on the event loop) of each with some to send."""
        assert not self._open, "the mirror starts before any database opens"
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def changed(self, db: InstanceDatabase) -> None:
        """``db`` has changes to send (called on any thread). An instance in
        a run is heard of when the run ends (``release``)."""
        if self._listener is None or self._loop is None or self._loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            if (db.tenant, db.instance_id) not in self._held:
                self._listener(db)
        else:
            self._loop.call_soon_threadsafe(self._listener, db)

    def hold(self, tenant: str, instance_id: str) -> None:
        """A run of the instance began: nothing it changes is read for the
        mirror until it ends."""
        key = (tenant, instance_id)
        self._held[key] = self._held.get(key, 0) + 1

    def release(self, tenant: str, instance_id: str) -> None:
        """A run of the instance ended. The last one under way has what the
        runs changed read at once, before another run can write (the read
        takes the database's lock now, ahead of any later operation; a busy
        instance would otherwise never be idle when the mirror looks), and
        kept for the mirror's next send. The run does not wait for it."""
        key = (tenant, instance_id)
        left = self._held.get(key, 1) - 1
        if left > 0:
            self._held[key] = left
            return
        self._held.pop(key, None)
        db = self._open.get(key)
        capture = None if db is None else db.capture
        if db is None or capture is None:
            return
        if not db.closed and db._conn is not None and (capture.noted or capture.wrote or capture.resend_whole):  # noqa: SLF001
            ops = db.ops
            task = asyncio.get_running_loop().create_task(self._read_after_run(db, ops))
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)
        elif capture.pending and self._listener is not None:
            self._listener(db)

    async def _read_after_run(self, db: InstanceDatabase, ops: int) -> None:
        capture = db.capture
        assert capture is not None
        try:
            # Nothing else ran on it since the run ended: what it reads is the run's end.
            rows, _ = await db.mirror_changes(whole=False, unless=lambda: db.ops != ops)
            if rows is not None:
                capture.stash = rows if capture.stash is None else capture.stash.merge(rows)
        except Exception:  # (the mirror reads them later, from the database)
            log.warning("instance %s: reading its changed rows failed", db.instance_id, exc_info=True)
        if capture.pending and self._listener is not None:
            self._listener(db)

    def held(self, db: InstanceDatabase) -> bool:
        return (db.tenant, db.instance_id) in self._held

    def take_slot(self, db: InstanceDatabase) -> None:
        """``db`` holds (or is about to open) a connection: it counts. A
        database opened apart (a read by a process that does not own the
        instance) is not this process's to bound."""
        if self._open.get((db.tenant, db.instance_id)) is db:
            with self._count_lock:
                if not db.slot:
                    db.slot = True
                    self.connections += 1

    def give_slot(self, db: InstanceDatabase) -> None:
        with self._count_lock:
            if db.slot:
                db.slot = False
                self.connections -= 1

    async def room_for(self, db: InstanceDatabase) -> None:
        """Before an operation opens ``db``: wait while every connection is
        taken, closing idle ones first (a run in progress keeps its own),
        then take one (taken here, not when the thread opens it: operations
        that start together must not all see room for one)."""
        if self._open.get((db.tenant, db.instance_id)) is not db:
            return
        while not db.slot and self.connections >= self.max_connections:
            self._start_trim()
            if self._trimming is not None:
                await asyncio.wait([self._trimming])
            if self.connections < self.max_connections:
                break
            # Every connection is in use: the next operation to end may leave one idle.
            if self._op_ended is None or self._op_ended.done():
                self._op_ended = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._op_ended)
        self.take_slot(db)

    def ended(self) -> None:
        """An operation ended: operations waiting for room look again."""
        if self._op_ended is not None and not self._op_ended.done():
            self._op_ended.set_result(None)

    def used(self, db: InstanceDatabase) -> None:
        """``db`` is about to run an operation (and so hold a connection)."""
        key = (db.tenant, db.instance_id)
        if self._open.get(key) is not db:
            return
        self._recent[key] = db
        self._recent.move_to_end(key)
        if len(self._recent) > self.max_connections:
            self._start_trim()

    def _start_trim(self) -> None:
        if self._trimming is None or self._trimming.done():
            self._trimming = asyncio.get_running_loop().create_task(self._trim(), name="yoke-state-trim")

    async def _trim(self) -> None:
        """Close the connections of the least recently used idle databases
        until a tenth of the bound is free (so trims are not one per operation)."""
        target = self.max_connections - max(self.max_connections // 10, 1)
        busy: list[tuple[tuple[str, str], InstanceDatabase]] = []
        while len(self._recent) > target or (self.connections >= self.max_connections and self._recent):
            key, db = self._recent.popitem(last=False)
            try:
                released = await db.release_connection()
            except Exception:  # a close that failed leaves the connection to a later trim
                log.exception("closing the database of instance %s failed", db.instance_id)
                released = False
            if not released:
                busy.append((key, db))
        for key, db in busy:  # in use: recent again (one used meanwhile is back already)
            self._recent.setdefault(key, db)

    def get(self, tenant: str, instance_id: str) -> InstanceDatabase:
        key = (tenant, instance_id)
        db = self._open.get(key)
        if db is None:
            db = self._open[key] = InstanceDatabase(self, tenant, instance_id)
            if self._listener is not None:
                db.capture = Capture(instance_id)
        return db

    def forget_all(self) -> None:
        """Drop every cached copy (this worker's instances went to others)."""
        for tenant, instance_id in list(self._open):
            self.forget(tenant, instance_id)

    def forget(self, tenant: str, instance_id: str) -> None:
        """Drop the cached copy (the instance moved to another worker)."""
        self._recent.pop((tenant, instance_id), None)
        db = self._open.pop((tenant, instance_id), None)
        if db is not None:
            db.closed = True  # at once: an operation started from now on reopens nothing
            self.pool.submit(db.close)

    def remove(self, tenant: str, instance_id: str) -> None:
        """Drop the cached copy of a removed instance and, with file storage,
        its file (other storages keep no copy of their own here)."""
        self._recent.pop((tenant, instance_id), None)
        db = self._open.pop((tenant, instance_id), None)
        if db is not None:
            db.closed = True
        storage = self.storage

        def drop() -> None:
            if db is not None:
                db.close()
            if isinstance(storage, FileStorage):
                path = storage.path(tenant, instance_id)
                for suffix in ("", "-wal", "-shm"):
                    path.with_name(path.name + suffix).unlink(missing_ok=True)

        self.pool.submit(drop)

    async def reads_done(self) -> None:
        """Until the reads started at runs' ends are done."""
        while self._reading:
            await asyncio.gather(*list(self._reading), return_exceptions=True)

    async def close(self) -> None:
        await self.reads_done()
        if self._trimming is not None:
            self._trimming.cancel()
            await asyncio.wait([self._trimming])
        self._recent.clear()
        await self.storage.close()
        for db in self._open.values():
            self.pool.submit(db.close)
        self._open.clear()
        await asyncio.to_thread(self.pool.shutdown, wait=True)


def make_storage(
    mode: str, *, store: ActorStore, data_dir: str, settings: Any, postgres: bool, clock: Clock = SYSTEM
) -> StateStorage:
    mode = mode or ("pg_sqlite" if postgres else "file")
    if mode == "file":
        return FileStorage(FileStorage.root_in(data_dir))
    if mode == "pg_sqlite":
        return PgSqliteStorage(store, asyncio.get_running_loop(), clock)
    if mode == "s3":
        from .storage_s3 import S3Storage

        # A cache of this process's own: processes sharing a data directory
        # must never replace a file another one has open.
        return S3Storage(settings, Path(data_dir) / "s3-cache" / f"{os.getpid()}-{secrets.token_hex(4)}")
    raise errors.InvalidInput(f"YOKE_STORAGE must be file, pg_sqlite or s3, not {mode!r}")

