"""PostgreSQL's connection and transaction primitives: the runtime pool,
the heartbeat connection, one statement (``run``) or one transaction under
a tenant (``tx``), and the mapping of database faults to ``Unavailable``.

Every part of the PostgreSQL store (streams, reads, consumers, objects,
tokens, actors, subscriptions, Durable Streams, the outbox) receives the one
``PgDb`` and works through these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg

from ... import errors
from ...clock import SYSTEM, Clock, wall_ms
from ..faults import unavailable
from .faults import READ_ONLY, connection_lost, is_closed, reached_standby, refused_before_send, rolled_back

log = logging.getLogger("yoke.store.postgres")
LOST = "the database connection was lost; retry later"
NO_ANSWER = "the database did not answer in time; retry later"

# A server that accepts a connection and then says nothing (a hung machine,
# a network partition: the kernel still completes the handshake, or nothing
# comes back at all) would hold a connect or a statement for ever, and
# asyncpg's one connect timeout covers a whole multi-host list, so a hung
# first host would never let it reach the primary behind it. Hence a
# timeout per host (connect) and a deadline per statement (PgDb).
CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 15.0
# Statements whose work grows with the data (deleting a stream's rows, a
# retention pass, a fork's copy) get this deadline instead: a retry would
# redo the same work, so cutting them at the usual one could never finish.
BULK_TIMEOUT_S = 600.0


# Query parameters that make a host list more than "each in turn, the first
# writable one wins": such a URL is left to asyncpg whole.
_WHOLE = ("host", "port", "load_balance_hosts")
_IN_TURN = ("read-write", "primary")


def hosts_of(dsn: str) -> list[str]:
    """``dsn`` once per host of its multi-host list (``h1:5432,h2:5433``),
    in order. A DSN with one host, with hosts or ports in its query, with
    ``load_balance_hosts``, or a ``target_session_attrs`` that may fall back
    to any host (``prefer-standby``, ``any``...) stays whole."""
    parts = urlsplit(dsn)
    login, at, hosts = parts.netloc.rpartition("@")
    query = dict(parse_qsl(parts.query))
    if "," not in hosts or any(k in query for k in _WHOLE) \
            or query.get("target_session_attrs", "read-write") not in _IN_TURN:
        return [dsn]
    return [urlunsplit(parts._replace(netloc=f"{login}{at}{host}")) for host in hosts.split(",")]


async def connect(dsn: str, *, timeout_s: float = CONNECT_TIMEOUT_S, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` trying each host in turn for ``timeout_s`` (as
    libpq's ``connect_timeout`` does), keeping the URL's
    ``target_session_attrs``: a standby is passed over for the next host.
    Also a pool's ``connect`` hook."""
    last: BaseException | None = None
    for each in hosts_of(dsn):
        try:
            return await asyncpg.connect(each, timeout=timeout_s, **kwargs)
        except Exception as exc:  # as libpq: any failure, a standby's included, moves on to the next host
            last = exc
    assert last is not None
    raise last


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Pool release hook. The default one costs a round trip per use to reset
    session state; Yoke keeps none (the tenant setting is transaction-local,
    and asyncpg still rolls back any open transaction itself)."""


def connect_failed(exc: BaseException) -> errors.Unavailable:
    log.warning("could not connect to the database: %r", exc)
    return unavailable("could not connect to the database; retry later", "connect_failed")


def quoted(value: str) -> str:
    """``value`` as an SQL string literal, whatever the server's
    ``standard_conforming_strings`` (an E'' string reads backslashes as
    escapes either way)."""
    if "\x00" in value:
        raise errors.InvalidInput("text cannot contain NUL characters")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


async def _to_the_end(conn: asyncpg.Connection, statement: str, *, or_else: Callable[[], None] | None = None) -> None:
    """Run ``statement`` (COMMIT or ROLLBACK: one round trip) to its end even
    when the caller is cancelled meanwhile; the cancellation is raised after
    it. Cut off halfway, the connection would go back to the pool inside its
    transaction (asyncpg then rolls it back, warning "Resetting connection
    with an active transaction"), and a commit's outcome would be unknown.
    ``or_else``: called instead of raising when the statement fails (a
    rollback on a broken connection: terminate it)."""
    task = asyncio.ensure_future(conn.execute(statement))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None:
            conn.terminate()
        raise
    except Exception:
        if or_else is None:
            raise
        or_else()


class PgDb:
    """The runtime's connections to one database."""

    def __init__(
        self, *, pool_min: int, pool_max: int, server_settings: dict[str, str], clock: Clock = SYSTEM,
        connect_timeout_s: float = CONNECT_TIMEOUT_S, command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        # The runtime's clock, for the times the parts stamp themselves (a
        # fact's, an attempt's). Leases and heartbeats compared across
        # processes use the server's clock instead, in the SQL (actors.DB_NOW_MS).
        self.clock = clock
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._settings = server_settings
        # Each statement's deadline on the client side (0: none): past it the
        # connection is dropped and the call is ``Unavailable``, as if cut.
        self._connect = partial(connect, timeout_s=connect_timeout_s)
        self._command_timeout = command_timeout_s or None
        self._pool: asyncpg.Pool | None = None
        # One connection of its own for heartbeats (worker and delivery
        # membership), made when first used: a beat never waits for a pool
        # connection behind the runtime's work.
        self._beats: asyncpg.Pool | None = None
        # Connections of their own for SQL catalogue queries (store/postgres/
        # catalogue.py): a long query never holds one the runtime needs, and
        # each goes back reset (asyncpg's default: settings, advisory locks,
        # listens), whatever the query did to its session.
        self._queries: asyncpg.Pool | None = None
        # Server pids of this pool's open connections: their NOTIFYs announce
        # what this process already woke itself for, so the listener skips
        # them. A pid leaves with its connection: PostgreSQL reuses pids, and
        # a NOTIFY from a reused one is another process's.
        self.own_pids: set[int] = set()

    def now_ms(self) -> int:
        """The clock's wall time in milliseconds, as the tables keep it."""
        return wall_ms(self.clock)

    # --- lifecycle ----------------------------------------------------------

    async def open_pool(self, dsn: str) -> None:
        """Make the runtime pool (asyncpg's errors pass through: the caller says why)."""
        self._pool = await asyncpg.create_pool(
            dsn,
            min_size=self._pool_min,
            max_size=self._pool_max,
            connect=self._connect,
            reset=_keep_session,
            init=self._note_pid,
            server_settings=self._settings,
            command_timeout=self._command_timeout,
        )

    async def open_beats(self, dsn: str) -> None:
        """Make the heartbeat pool: min_size 0, no connection until a heartbeat needs it."""
        self._beats = await asyncpg.create_pool(
            dsn, min_size=0, max_size=1, connect=self._connect, reset=_keep_session, init=self._note_pid,
            server_settings=self._settings, command_timeout=self._command_timeout,
        )

    async def open_queries(self, dsn: str, size: int) -> None:
        """Make the catalogue queries' pool: no connection until a query needs one."""
        self._queries = await asyncpg.create_pool(
            dsn, min_size=0, max_size=size, connect=self._connect, server_settings=self._settings,
            command_timeout=None,
        )

    @asynccontextmanager
    async def read_only(self, tenant: str) -> AsyncIterator[asyncpg.Connection]:
        """A read-only transaction under ``tenant`` on a catalogue query
        connection; a lost connection is ``Unavailable``."""
        assert self._queries is not None, "store not started"
        async with self._queries.acquire() as conn:
            try:
                async with conn.transaction(readonly=True):
                    await conn.execute(f"SELECT set_config('yoke.tenant', {quoted(tenant)}, true)")
                    yield conn
            except Exception as exc:
                fault = await self.fault(conn, exc)
                if fault is None:
                    raise
                raise fault from exc

    async def _note_pid(self, conn: asyncpg.Connection) -> None:
        """Pool init hook: remember a new connection's pid until it closes
        (however it closes: cut, terminated, closed by the pool)."""
        pid = conn.get_server_pid()
        self.own_pids.add(pid)
        conn.add_termination_listener(lambda _conn: self.own_pids.discard(pid))

    async def close(self) -> None:
        for pool in (self._queries, self._beats, self._pool):
            if pool is not None:
                await pool.close()
        self._queries = self._beats = self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "store not started"
        return self._pool

    def pool_sizes(self) -> tuple[int, int, int] | None:
        """(connections, idle, max) of the pool; None before it opens or after it closes."""
        pool = self._pool
        if pool is None:
            return None
        return pool.get_size(), pool.get_idle_size(), pool.get_max_size()

    @property
    def pool_max(self) -> int:
        return self._pool_max

    # --- connections ------------------------------------------------------------
    #
    # Every statement runs through run (one statement on its own) or tx
    # (a transaction under a tenant); connection is for the few units that
    # need neither. They release the connection whatever happens and turn a
    # lost connection, or a statement the server cancelled or rolled back on
    # a conflict, into errors.Unavailable (see faults.py); any other failure
    # (a SQL error: a bug) passes through unchanged.

    async def _acquire(self, pool: asyncpg.Pool | None = None) -> asyncpg.Connection:
        pool = pool or self.pool
        try:
            return await pool.acquire()
        except asyncpg.InterfaceError as exc:
            if pool.is_closing():
                raise errors.RuntimeClosed("the store is closed") from exc
            raise connect_failed(exc) from exc
        except Exception as exc:  # refused, unreachable, too many connections, starting up
            raise connect_failed(exc) from exc

    async def _release(self, conn: asyncpg.Connection, pool: asyncpg.Pool | None = None) -> None:
        try:
            await (pool or self.pool).release(conn)
        except Exception as exc:  # the pool terminated it: nothing of ours depends on it
            log.debug("releasing a connection failed: %r", exc)

    @staticmethod
    async def fault(conn: asyncpg.Connection, exc: Exception) -> errors.Unavailable | None:
        """``Unavailable`` for a database fault (a lost connection, or a
        statement rolled back by a cancel or a conflict); None for anything
        else, which passes through unchanged."""
        if isinstance(exc, errors.YokeError):
            return None
        if isinstance(exc, TimeoutError):  # the statement's deadline: the server said nothing
            conn.terminate()
            log.warning("a statement got no answer from the database in time; dropped its connection")
            return unavailable(NO_ANSWER, "connection_lost")
        found = rolled_back(exc)
        if found is not None:
            reason, message = found
            return unavailable(message, reason)
        if reached_standby(exc):
            conn.terminate()  # see faults.READ_ONLY: the pool's next connection finds the primary
            return unavailable(READ_ONLY[1], READ_ONLY[0])
        if await connection_lost(conn, exc):
            return unavailable(LOST, "connection_lost")
        return None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await self._acquire()
        try:
            yield conn
        except Exception as exc:
            fault = await self.fault(conn, exc)
            if fault is None:
                raise
            raise fault from exc
        finally:
            await self._release(conn)

    async def run(self, method: str, sql: str, *args: object, pool: asyncpg.Pool | None = None) -> object:
        """``conn.<method>(sql, *args)`` as a statement of its own (on a
        connection of ``pool``, by default the runtime's). Run again on
        another connection only when it provably never left this one (a
        connection the server had already cut, see faults.py): otherwise its
        outcome is unknown and the caller decides."""
        for attempt in itertools.count():
            conn = await self._acquire(pool)
            try:
                return await getattr(conn, method)(sql, *args)
            except Exception as exc:
                fault = await self.fault(conn, exc)
                if fault is None:
                    raise
                if fault.details["reason"] != "connection_lost" or not refused_before_send(exc) \
                        or attempt >= self._pool_max:
                    raise fault from exc
                log.info("a pooled connection had been cut; running the statement on another")
            finally:
                await self._release(conn, pool)
        raise AssertionError("unreachable")

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        return await self.run("fetch", sql, *args)  # type: ignore[return-value]

    async def fetchrow(self, sql: str, *args: object) -> asyncpg.Record | None:
        return await self.run("fetchrow", sql, *args)  # type: ignore[return-value]

    async def fetchval(self, sql: str, *args: object) -> object:
        return await self.run("fetchval", sql, *args)

    async def execute(self, sql: str, *args: object) -> str:
        return await self.run("execute", sql, *args)  # type: ignore[return-value]

    async def beat(self, sql: str, *args: object, method: str = "execute") -> Any:
        """A heartbeat's statement, on the heartbeat connection."""
        assert self._beats is not None, "store not started"
        return await self.run(method, sql, *args, pool=self._beats)

    async def _begin(self, tenant: str) -> asyncpg.Connection:
        """A connection in a transaction with ``yoke.tenant`` set. BEGIN and
        set_config change nothing, so a connection lost on them is simply
        replaced by another one, and a cancelled one is tried again.

        Plain BEGIN / COMMIT / ROLLBACK statements, not asyncpg's Transaction:
        a BEGIN cut off by a cancellation leaves a Transaction that can no
        longer be rolled back, and the pool warns about it on release."""
        for attempt in itertools.count():
            conn = await self._acquire()
            try:
                # One round trip for both (the simple protocol takes two
                # statements, but no parameters): a transaction cost four
                # round trips where it ran one statement.
                await conn.execute(f"BEGIN; SELECT set_config('yoke.tenant', {quoted(tenant)}, true)")
                return conn
            except BaseException as exc:
                try:
                    fault = await self.fault(conn, exc) if isinstance(exc, Exception) else None
                    if not is_closed(conn):  # whether BEGIN took effect or not
                        await _to_the_end(conn, "ROLLBACK", or_else=conn.terminate)
                finally:
                    await self._release(conn)
                if fault is None:
                    raise
                # A statement that got no answer: the server hangs, and every
                # other connection to it would wait as long. Do not try them.
                if attempt >= self._pool_max or isinstance(exc, TimeoutError):
                    raise fault from exc
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def tx(self, tenant: str) -> AsyncIterator[asyncpg.Connection]:
        """One transaction under ``tenant``: committed when the block ends,
        rolled back when it raises. A connection lost on the way is
        ``Unavailable`` (a lost COMMIT leaves the outcome unknown), and so is
        a statement cancelled or rolled back on a conflict (nothing written).
        A caller cancelled meanwhile (a timeout, a stopping task) still ends
        the transaction before the connection goes back to the pool."""
        conn = await self._begin(tenant)
        try:
            try:
                yield conn
            except BaseException:
                if not is_closed(conn):
                    # (if ROLLBACK fails, the session ends, and its transaction with it)
                    await _to_the_end(conn, "ROLLBACK", or_else=conn.terminate)
                raise
            await _to_the_end(conn, "COMMIT")
        except Exception as exc:
            fault = await self.fault(conn, exc)
            if fault is None:
                raise
            raise fault from exc
        finally:
            await self._release(conn)
