"""Which asyncpg failures mean "the connection is gone", which mean "the
statement was rolled back, try again", and one that provably happened
before a statement left.

The store runs every statement through ``PostgresStore._run`` or
``PostgresStore._tx``; they ask ``connection_lost`` about each failure and
turn a lost connection into ``errors.Unavailable`` (see ``yoke/store/faults.py``),
and ``rolled_back`` turns a statement the server cancelled or that lost a
conflict into ``errors.Unavailable`` too, with the reason it returns.

Rolled back. A cancelled statement (57014: ``pg_cancel_backend``, a
``statement_timeout``), a deadlock victim (40P01), a serialization failure
(40001) and a lock that could not be taken (55P03: ``lock_timeout``,
``NOWAIT``) are ordinary errors of the statement: the server rolls back its
transaction (an explicit one is rolled back by ``_tx``) and the session
lives on. None of them can strike once the commit has begun (PostgreSQL
holds interrupts while it commits, a cancel that arrives while the session
is idle is dropped, and such an error ends the transaction unsuccessfully),
so the outcome is known: nothing was written, and the same call may be made
again, even an append without an idempotency key.

The idle-connection trap. ``pg_terminate_backend`` (or a server shutdown)
makes the server send a FATAL ErrorResponse on every connection it ends,
idle ones included, then close the socket. asyncpg parses that message on a
connection sitting idle in the pool as an unexpected message: its protocol
state becomes "error consume", waiting for a ReadyForQuery that never comes,
while ``is_closed()`` still says False until the end of the stream is read,
one or two event-loop turns later. A task that takes the connection from the
pool in that window gets ``InternalClientError('cannot switch to state N;
another operation (2) is in progress')``: not two operations on one
connection, but the server's goodbye still sitting in the protocol state.
asyncpg raises it from its state switch, before it writes anything, so the
statement never reached the server and may be run again on another
connection (``refused_before_send``); and the connection is closed a moment
later (``connection_lost`` waits for that, to tell this from a real bug).
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from asyncpg import exceptions as pgx

# How long a connection that failed oddly gets to show it was cut.
CLOSE_WAIT_S = 1.0

# Failures of the connection rather than of the statement: SQLSTATE class 08
# (but not a protocol violation, which would be a driver bug), the server
# ending or refusing sessions (57P01 terminate/shutdown, 57P02 crash, 57P03
# starting up, 57P04 database dropped, 57P05 idle session timeout, 53300 too
# many connections, 25P03 idle-in-transaction timeout), and the network.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pgx.PostgresConnectionError,
    pgx.AdminShutdownError,
    pgx.CrashShutdownError,
    pgx.CannotConnectNowError,
    pgx.DatabaseDroppedError,
    pgx.IdleSessionTimeoutError,
    pgx.TooManyConnectionsError,
    pgx.IdleInTransactionSessionTimeoutError,
    OSError,
)
NOT_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (pgx.ProtocolViolationError,)

# Failures of a statement whose transaction is known to be rolled back, on a
# connection that stays usable (see above), and the reason callers are given.
ROLLED_BACK: tuple[tuple[type[BaseException], str, str], ...] = (
    (pgx.QueryCanceledError, "cancelled",
     "the database cancelled the statement; nothing was written; retry"),
    (pgx.DeadlockDetectedError, "conflict",
     "the statement was chosen as a deadlock victim; nothing was written; retry"),
    (pgx.SerializationError, "conflict",
     "the statement conflicted with a concurrent transaction; nothing was written; retry"),
    (pgx.LockNotAvailableError, "conflict",
     "a lock the statement needed was not available; nothing was written; retry"),
)


# A write refused because the session is read-only (25006): after a failover
# the connection reaches a standby (the old primary, now following, or a
# pooler's stale backend). The transaction is rolled back, so nothing was
# written; the connection must go, so that the pool opens another, which
# ``target_session_attrs=read-write`` (or the pooler) sends to the primary.
READ_ONLY = ("read_only", "the database is read-only (a standby, or a primary being replaced); nothing was written;"
                          " retry")


def reached_standby(exc: BaseException) -> bool:
    return isinstance(exc, pgx.ReadOnlySQLTransactionError)


def is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, CONNECTION_ERRORS) and not isinstance(exc, NOT_CONNECTION_ERRORS)


def rolled_back(exc: BaseException) -> tuple[str, str] | None:
    """``(reason, message)`` when ``exc`` is a statement failure whose
    transaction is known to be rolled back (cancelled, a conflict); else None."""
    for kind, reason, message in ROLLED_BACK:
        if isinstance(exc, kind):
            return reason, message
    return None


def is_closed(conn: asyncpg.Connection) -> bool:
    """Whether a connection we still hold was closed under us. The pool takes
    a pool connection back as soon as it closes (its proxy then refuses
    every call), which also means closed."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


async def wait_closed(conn: asyncpg.Connection, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the connection to close; whether it did."""
    if is_closed(conn):
        return True
    closed = asyncio.get_running_loop().create_future()

    def on_close(_conn: object) -> None:
        if not closed.done():
            closed.set_result(None)

    try:
        conn.add_termination_listener(on_close)
    except asyncpg.InterfaceError:
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await closed
    except TimeoutError:
        pass
    finally:
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.remove_termination_listener(on_close)
    return is_closed(conn)


async def connection_lost(conn: asyncpg.Connection, exc: BaseException) -> bool:
    """Whether ``exc``, raised while using ``conn``, means the connection is
    gone. A connection whose client state machine failed and that does not
    close is terminated (it must not be reused) and the failure is a bug."""
    if is_closed(conn):
        return True
    if is_connection_error(exc):
        conn.terminate()
        return True
    # Only the plain classes: their subclasses (DataError for a bad
    # argument, OutdatedSchemaCacheError, ...) are about the statement.
    if type(exc) in (asyncpg.InternalClientError, asyncpg.InterfaceError):
        if await wait_closed(conn, CLOSE_WAIT_S):
            return True
        conn.terminate()
    return False


def refused_before_send(exc: BaseException) -> bool:
    """asyncpg refused to start the statement (its state switch failed):
    nothing was written to the server."""
    return isinstance(exc, asyncpg.InternalClientError) and str(exc).startswith("cannot switch to state")
