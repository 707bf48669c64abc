"""Server backend: PostgreSQL through asyncpg.

Every query runs as the ``yoke_runtime`` role (no BYPASSRLS, owning no
table) with the tenant set per transaction, so row-level security isolates
tenants whatever the query. The hot paths (group commit, reads) are single round trips into the
SQL functions defined in the migrations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import orjson

from ... import errors
from ...events import Event, PreparedEvent, now_ms
from ...lifecycle import STREAM_DELETED, new_stream_id, stream_fact
from ..faults import log_retried, retry_reads, unavailable
from ..contract import (
    CommitResult,
    ConsumerInfo,
    Limits,
    ObjectInfo,
    Outcome,
    PayloadPage,
    ReadPage,
    Retention,
    StoredEvent,
    StreamInfo,
    StreamSettings,
    StreamTotals,
    MAX_GAPS,
    EphemeralCallback,
    GapEvidence,
    TokenInfo,
    WakeupCallback,
)
from ..rows import (
    ONE_ROW_MAX_BYTES,
    OBJECT_COLUMNS,
    STREAM_COLUMNS,
    TOKEN_COLUMNS,
    check_object_bytes,
    consumer_from_row,
    event_from_row,
    like_prefix,
    object_from_row,
    setting_changes,
    stored_event_from_row,
    stream_from_row,
    token_from_row,
)
from .actors import PgActorStore
from .faults import connection_lost, is_closed, refused_before_send, rolled_back
from ..protocol import OK, Guard, one_lifetime
from .outbox import PgOutboxStore
from .protocol import PgProtocolStore
from .subscriptions import PgSubscriptionStore
from .listener import Listener
from .relay import encode as encode_relayed
from .migrate import migrate, pending

log = logging.getLogger("yoke.store.postgres")
MAX_OFFSET = 2**63 - 1
LOST = "the database connection was lost; retry later"


def with_user(dsn: str, user: str) -> str:
    """The same server and database, logged in as ``user`` (no password)."""
    parts = urlsplit(dsn)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user)}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


# What lets a login past row-level security: SUPERUSER or BYPASSRLS, or
# owning Yoke's tables (directly or through a role it is a member of). FORCE'd
# row-level security binds an owner, but an owner can switch it off (ALTER
# TABLE ... NO FORCE), and migration 0006 gives a non-privileged owner a
# SELECT policy on tokens so that yoke_find_token can read as it.
RLS_ESCAPE = """
SELECT (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = session_user),
       ARRAY(SELECT c.relname::text FROM pg_class c
             WHERE c.relkind IN ('r', 'p') AND c.relrowsecurity
               AND c.relnamespace = (SELECT relnamespace FROM pg_class
                                     WHERE oid = to_regclass('tokens'))
               AND pg_has_role(session_user, c.relowner, 'MEMBER')
             ORDER BY c.relname)
"""


async def rls_escape(conn: asyncpg.Connection) -> str | None:
    """How this connection's login could get past row-level security, or
    None when it cannot (a runtime login must not)."""
    privileged, owned = await conn.fetchrow(RLS_ESCAPE)
    user = await conn.fetchval("SELECT session_user")
    if privileged:
        return f"the login {user} is a superuser or has BYPASSRLS"
    if owned:
        return f"the login {user} owns (or is a member of the owner of) the tables {', '.join(owned)}"
    return None


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Pool release hook. The default one costs a round trip per use to reset
    session state; Yoke keeps none (the tenant setting is transaction-local,
    and asyncpg still rolls back any open transaction itself)."""


def _connect_failed(exc: BaseException) -> errors.Unavailable:
    log.warning("could not connect to the database: %r", exc)
    return unavailable("could not connect to the database; retry later", "connect_failed")


APPEND = "SELECT * FROM yoke_append($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20)"
# The same, and each admitted ephemeral event's chunks NOTIFYed on the relay
# channel (relay.py, migration 0008).
APPEND_RELAY = (
    "SELECT * FROM yoke_append_relay($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,"
    "$19,$20,$21)"
)
# yoke_append into the lifetime ($21) a protocol append was decided for, or
# no row when the path no longer holds it (migration 0022).
APPEND_IN_LIFETIME = (
    "SELECT * FROM yoke_append_in_lifetime($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,"
    "$19,$20,$21)"
)


def _nullable(values: list[Any]) -> list[Any] | None:
    """A column of nullable values, or NULL when every value is: yoke_append
    reads a NULL array as all NULLs (unnest pads it, a subscript of it is
    NULL), and asyncpg spends about 0.3 us encoding each element."""
    return values if any(v is not None for v in values) else None


def _append_args(
    tenant: str, path: str, events: Sequence[PreparedEvent], batch_of: Sequence[int], now: int,
    new_stream_id: str, kernel: bool = False,
) -> tuple[object, ...]:
    return (
        tenant,
        path,
        new_stream_id,
        now,
        list(batch_of),
        [e.id for e in events],
        [e.type for e in events],
        [e.payload_json for e in events],
        [e.metadata_json for e in events],
        _nullable([e.source_json for e in events]),
        _nullable([e.correlation for e in events]),
        [e.priority for e in events],
        _nullable([e.group_id for e in events]),
        _nullable([e.idempotency_key for e in events]),
        _nullable([e.fingerprint for e in events]),
        [e.size for e in events],
        [e.ephemeral for e in events],
        _nullable([e.object_id for e in events]),
        kernel,
        _nullable([e.data for e in events]),
    )


def _commit_result(rows: Sequence[asyncpg.Record], events: Sequence[PreparedEvent]) -> CommitResult:
    status, first, _, at, head = rows[0]
    if rows[0][2] is None:
        # The fast path (a single row, no id): consecutive offsets from ``first``.
        outcomes = [Outcome("ok", first + i, e.id, at) for i, e in enumerate(events)]
    else:
        outcomes = [Outcome(r[0], r[1], r[2], r[3]) for r in rows]
    return CommitResult(outcomes=outcomes, head=head)


class PostgresStore:
    relays_ephemeral = True

    def __init__(
        self,
        dsn: str,
        *,
        role: str = "yoke_runtime",
        runtime_dsn: str | None = None,
        pool_min: int = 2,
        pool_max: int = 10,
    ) -> None:
        self.dsn = dsn  # used for migrations
        self.role = role
        self.runtime_dsn = runtime_dsn
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._pool: asyncpg.Pool | None = None
        self.listener: Listener | None = None
        self.actors = PgActorStore(self)
        self.subscriptions = PgSubscriptionStore(self)
        self.protocol = PgProtocolStore(self)
        self.outbox = PgOutboxStore(self)
        # Server pids of this pool's open connections: their NOTIFYs announce
        # what this process already woke itself for, so the listener skips
        # them. A pid leaves with its connection: PostgreSQL reuses pids, and
        # a NOTIFY from a reused one is another process's.
        self._own_pids: set[int] = set()
        self._relay_channel: str | None = None  # secret: migration 0008
        self._barrier_prefix = os.urandom(6).hex()
        self._barriers = itertools.count()

    # --- lifecycle ----------------------------------------------------------

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None,
    ) -> None:
        try:
            conn = await asyncpg.connect(self.dsn)
        except Exception as exc:
            raise _connect_failed(exc) from exc
        try:
            await migrate(conn)
            hand_over = await rls_escape(conn) is not None
        finally:
            await conn.close()
        # The runtime must log in as a role that row-level security binds:
        # never the tables' owner, nor a superuser or BYPASSRLS login. Such a
        # migration login hands over to the runtime role (same server and
        # database; YOKE_PG_RUNTIME_URL to set credentials).
        derived = self.runtime_dsn is None and hand_over
        pool_dsn = self.runtime_dsn or (with_user(self.dsn, self.role) if hand_over else self.dsn)
        try:
            self._pool = await asyncpg.create_pool(
                pool_dsn,
                min_size=self._pool_min,
                max_size=self._pool_max,
                reset=_keep_session,
                init=self._note_pid,
            )
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            if not derived:
                raise _connect_failed(exc) from exc
            raise errors.YokeError(
                f"the PostgreSQL runtime role {self.role} could not log in ({exc}): the"
                " migration login owns the tables or bypasses row-level security, so the"
                f" runtime logs in as {self.role}; give its credentials in YOKE_PG_RUNTIME_URL"
            ) from exc
        except Exception as exc:
            raise _connect_failed(exc) from exc
        async with self._connection() as check:
            escape = await rls_escape(check)
            if escape is None:
                self._relay_channel = await check.fetchval("SELECT channel FROM yoke_relay")
        if escape is not None:
            await self._pool.close()
            self._pool = None
            raise errors.YokeError(
                f"the PostgreSQL runtime login would get past row-level security: {escape};"
                " log the runtime in as a role that neither owns Yoke's tables nor has"
                " SUPERUSER or BYPASSRLS (the default yoke_runtime; YOKE_PG_RUNTIME_URL)"
            )
        self.listener = Listener(
            pool_dsn, on_wakeup, on_resync, own_pids=self._own_pids,
            relay_channel=self._relay_channel, on_ephemeral=on_ephemeral,
        )
        try:
            await self.listener.start()
        except Exception as exc:
            await self._pool.close()
            raise _connect_failed(exc) from exc

    async def _note_pid(self, conn: asyncpg.Connection) -> None:
        """Pool init hook: remember a new connection's pid until it closes
        (however it closes: cut, terminated, closed by the pool)."""
        pid = conn.get_server_pid()
        self._own_pids.add(pid)
        conn.add_termination_listener(lambda _conn: self._own_pids.discard(pid))

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def ready(self) -> None:
        async with self._connection() as conn:
            missing = await pending(conn)
        if missing:
            raise errors.YokeError(f"migrations not applied: {', '.join(missing)}")

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "store not started"
        return self._pool

    # --- connections ------------------------------------------------------------
    #
    # Every statement runs through _run (one statement on its own) or _tx
    # (a transaction under a tenant); _connection is for the few units that
    # need neither. They release the connection whatever happens and turn a
    # lost connection, or a statement the server cancelled or rolled back on
    # a conflict, into errors.Unavailable (see faults.py); any other failure
    # (a SQL error: a bug) passes through unchanged.

    async def _acquire(self) -> asyncpg.Connection:
        try:
            return await self.pool.acquire()
        except asyncpg.InterfaceError as exc:
            if self.pool.is_closing():
                raise errors.RuntimeClosed("the store is closed") from exc
            raise _connect_failed(exc) from exc
        except Exception as exc:  # refused, unreachable, too many connections, starting up
            raise _connect_failed(exc) from exc

    async def _release(self, conn: asyncpg.Connection) -> None:
        try:
            await self.pool.release(conn)
        except Exception as exc:  # the pool terminated it: nothing of ours depends on it
            log.debug("releasing a connection failed: %r", exc)

    @staticmethod
    async def _fault(conn: asyncpg.Connection, exc: Exception) -> errors.Unavailable | None:
        """``Unavailable`` for a database fault (a lost connection, or a
        statement rolled back by a cancel or a conflict); None for anything
        else, which passes through unchanged."""
        if isinstance(exc, errors.YokeError):
            return None
        found = rolled_back(exc)
        if found is not None:
            reason, message = found
            return unavailable(message, reason)
        if await connection_lost(conn, exc):
            return unavailable(LOST, "connection_lost")
        return None

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await self._acquire()
        try:
            yield conn
        except Exception as exc:
            fault = await self._fault(conn, exc)
            if fault is None:
                raise
            raise fault from exc
        finally:
            await self._release(conn)

    async def _run(self, method: str, sql: str, *args: object) -> object:
        """``conn.<method>(sql, *args)`` as a statement of its own. Run again
        on another connection only when it provably never left this one (a
        connection the server had already cut, see faults.py): otherwise its
        outcome is unknown and the caller decides."""
        for attempt in itertools.count():
            conn = await self._acquire()
            try:
                return await getattr(conn, method)(sql, *args)
            except Exception as exc:
                fault = await self._fault(conn, exc)
                if fault is None:
                    raise
                if fault.details["reason"] != "connection_lost" or not refused_before_send(exc) \
                        or attempt >= self._pool_max:
                    raise fault from exc
                log.info("a pooled connection had been cut; running the statement on another")
            finally:
                await self._release(conn)
        raise AssertionError("unreachable")

    async def _fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        return await self._run("fetch", sql, *args)  # type: ignore[return-value]

    async def _fetchrow(self, sql: str, *args: object) -> asyncpg.Record | None:
        return await self._run("fetchrow", sql, *args)  # type: ignore[return-value]

    async def _fetchval(self, sql: str, *args: object) -> object:
        return await self._run("fetchval", sql, *args)

    async def _execute(self, sql: str, *args: object) -> str:
        return await self._run("execute", sql, *args)  # type: ignore[return-value]

    async def _begin(self, tenant: str) -> tuple[asyncpg.Connection, asyncpg.transaction.Transaction]:
        """A connection in a transaction with ``yoke.tenant`` set. BEGIN and
        set_config change nothing, so a connection lost on them is simply
        replaced by another one, and a cancelled one is tried again."""
        for attempt in itertools.count():
            conn = await self._acquire()
            tx = conn.transaction()
            try:
                await tx.start()
                await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
                return conn, tx
            except BaseException as exc:
                fault = await self._fault(conn, exc) if isinstance(exc, Exception) else None
                if fault is not None and not is_closed(conn):
                    # Rolled back (cancelled): end the transaction asyncpg
                    # still tracks, or drop the connection if that fails.
                    try:
                        await tx.rollback()
                    except Exception:
                        conn.terminate()
                await self._release(conn)
                if fault is None:
                    raise
                if attempt >= self._pool_max:
                    raise fault from exc
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def _tx(self, tenant: str) -> AsyncIterator[asyncpg.Connection]:
        """One transaction under ``tenant``: committed when the block ends,
        rolled back when it raises. A connection lost on the way is
        ``Unavailable`` (a lost COMMIT leaves the outcome unknown), and so is
        a statement cancelled or rolled back on a conflict (nothing written)."""
        conn, tx = await self._begin(tenant)
        try:
            try:
                yield conn
            except BaseException:
                if not is_closed(conn):
                    try:
                        await tx.rollback()
                    except Exception:  # the session ends, and its transaction with it
                        conn.terminate()
                raise
            await tx.commit()
        except Exception as exc:
            fault = await self._fault(conn, exc)
            if fault is None:
                raise
            raise fault from exc
        finally:
            await self._release(conn)

    # --- writes --------------------------------------------------------------

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
        if guards is not None:
            lifetime = one_lifetime(guards)
            if lifetime is not None:  # the common case: one statement still
                args = _append_args(tenant, path, events, batch_of, now, new_stream_id)
                rows = await self._fetch(APPEND_IN_LIFETIME, *args, lifetime)
                if rows:
                    result = _commit_result(rows, events)
                    return CommitResult(outcomes=result.outcomes, head=result.head, guards=[OK] * len(guards))
            # Checks of producers, Stream-Seq or a close, or a lifetime no
            # longer at the path: decided batch by batch.
            return await self.protocol.commit_guarded(tenant, path, events, batch_of, now, new_stream_id, guards)
        args = _append_args(tenant, path, events, batch_of, now, new_stream_id)
        if any(e.ephemeral for e in events):
            # yoke_append_relay: the first 18 (no p_kernel, no p_data: ephemeral events carry no bytes)
            owners, chunks = encode_relayed(tenant, path, now, events)
            rows = await self._fetch(APPEND_RELAY, *args[:18], self._relay_channel, owners, chunks)
        else:
            rows = await self._fetch(APPEND, *args)
        return _commit_result(rows, events)

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        listener = self.listener
        if listener is None:
            return False
        token = f"{self._barrier_prefix}{next(self._barriers):x}"
        waiter = listener.barriers[token] = asyncio.get_running_loop().create_future()
        try:
            await self._execute("SELECT pg_notify($1, $2)", self._relay_channel, "b:" + token)
            async with asyncio.timeout(timeout_s):
                return await waiter
        except (TimeoutError, errors.Unavailable):
            return False
        finally:
            listener.barriers.pop(token, None)

    async def _commit_in(
        self, conn: asyncpg.Connection, tenant: str, path: str, events: Sequence[PreparedEvent],
        now: int, new_stream_id: str,
    ) -> Outcome:
        """Append one caller batch inside the caller's transaction (kernel
        writes that must commit together with rows of their own)."""
        return (await self._commit_batch(conn, tenant, path, events, now, new_stream_id)).outcomes[0]

    async def _commit_batch(
        self, conn: asyncpg.Connection, tenant: str, path: str, events: Sequence[PreparedEvent],
        now: int, new_stream_id: str, *, kernel: bool = False,
    ) -> CommitResult:
        """Like ``_commit_in``, with every event's outcome. ``kernel``:
        subscription bookkeeping that a closed or full stream still takes."""
        rows = await conn.fetch(
            APPEND, *_append_args(tenant, path, events, [0] * len(events), now, new_stream_id, kernel)
        )
        return _commit_result(rows, events)

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        async with self._tx(tenant) as conn:
            result = await self._commit_batch(conn, tenant, "/", [event], now, new_stream_id, kernel=True)
        return result.outcomes[0]

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        async with self._tx(tenant) as conn:
            created = await self._ensure_stream(conn, tenant, path, stream_id, now, settings)
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row), created

    async def _ensure_stream(
        self, conn: asyncpg.Connection, tenant: str, path: str, stream_id: str, now: int,
        settings: StreamSettings | None = None,
    ) -> bool:
        """Create the stream (and its tenant's directory entry) if missing."""
        settings = settings or StreamSettings()
        lim, ret = settings.limits, settings.retention
        await conn.execute("INSERT INTO yoke_tenants VALUES ($1, $2) ON CONFLICT DO NOTHING", tenant, now)
        created = await conn.fetchval(
            "INSERT INTO streams (tenant_id, path, stream_id, created_at, max_age_s, max_events,"
            " max_unread_events, max_unread_bytes, max_total_events, max_total_bytes, overflow,"
            " block_timeout_s, pinned, metadata, data_handling)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14::json,$15::json)"
            " ON CONFLICT DO NOTHING RETURNING true",
            tenant, path, stream_id, now, ret.max_age_s, ret.max_events,
            lim.max_unread_events, lim.max_unread_bytes, lim.max_total_events,
            lim.max_total_bytes, lim.overflow, lim.block_timeout_s, settings.pinned,
            orjson.dumps(settings.metadata).decode(),
            None if settings.data_handling is None else orjson.dumps(settings.data_handling).decode(),
        )
        return bool(created)

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
        async with self._tx(tenant) as conn:
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
        async with self._tx(tenant) as conn:
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
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id=$1 AND sid=$2", tenant, s["sid"])
            for table in ("subscriptions", "processor_checkpoints", "subscription_inbound", "subscription_catalogues"):
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id=$1 AND path=$2", tenant, path)
            await conn.execute("DELETE FROM streams WHERE tenant_id=$1 AND sid=$2", tenant, s["sid"])
            if path != "/":  # (the global stream is never deleted)
                fact = stream_fact(STREAM_DELETED, path, row["stream_id"])
                await self._commit_batch(conn, tenant, "/", [fact], now_ms(), new_stream_id(), kernel=True)
            # Tails in other processes read again and see it gone (at commit).
            await conn.execute("SELECT pg_notify('yoke_stream', $1)", f"{tenant}|{path}")
        return stream_from_row(row)

    async def prune(self, now: int) -> int:
        removed = 0
        for tenant in await self._tenants():
            async with self._tx(tenant) as conn:
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

    async def _tenants(self) -> list[str]:
        return [r[0] for r in await self._fetch("SELECT tenant_id FROM yoke_tenants")]

    async def _prune_stream(self, tenant: str, sid: int, now: int) -> int:
        async with self._tx(tenant) as conn:
            # Lock the stream row: a legal hold set meanwhile wins, and the
            # credit counters change with the rows.
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND sid=$2 FOR UPDATE", tenant, sid
            )
            if s is None or s["legal_hold"]:
                return 0
            threshold = 0
            if s["max_events"] is not None:
                seq = await conn.fetchval(
                    "SELECT seq FROM events WHERE tenant_id=$1 AND sid=$2"
                    " ORDER BY seq DESC LIMIT 1 OFFSET $3",
                    tenant, sid, s["max_events"],
                )
                threshold = max(threshold, seq or 0)
            if s["max_age_s"] is not None:
                cutoff = now - int(s["max_age_s"] * 1000)
                seq = await conn.fetchval(
                    "SELECT max(seq) FROM events WHERE tenant_id=$1 AND sid=$2 AND at < $3",
                    tenant, sid, cutoff,
                )
                threshold = max(threshold, seq or 0)
            if threshold <= s["pruned_through"]:
                return 0
            min_ack = s["min_ack"] if s["min_ack"] is not None else threshold
            n, size, n_unread, size_unread = await conn.fetchrow(
                "WITH gone AS (DELETE FROM events WHERE tenant_id=$1 AND sid=$2 AND seq <= $3"
                " RETURNING seq, size)"
                " SELECT count(*), coalesce(sum(size), 0), count(*) FILTER (WHERE seq > $4),"
                " coalesce(sum(size) FILTER (WHERE seq > $4), 0) FROM gone",
                tenant, sid, threshold, min_ack,
            )
            await conn.execute(
                "UPDATE streams SET pruned_through=$3, durable_events=durable_events-$4,"
                " durable_bytes=durable_bytes-$5, unread_events=unread_events-$6,"
                " unread_bytes=unread_bytes-$7 WHERE tenant_id=$1 AND sid=$2",
                tenant, sid, threshold, n, size, n_unread, size_unread,
            )
        return n

    # --- consumers -----------------------------------------------------------

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        async with self._tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if s is None:
                raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
            if offset > s["head"]:
                raise errors.InvalidAck(
                    f"offset {offset} is beyond the head {s['head']}", offset=offset, latest=s["head"]
                )
            row = await conn.fetchrow(
                "SELECT acked, created_at FROM consumers WHERE tenant_id=$1 AND sid=$2 AND consumer_id=$3",
                tenant, s["sid"], consumer_id,
            )
            if row is not None and offset < row[0]:
                raise errors.AckRegression(
                    f"consumer {consumer_id} already acknowledged {row[0]}",
                    consumer=consumer_id, acked=row[0], offset=offset,
                )
            created = row[1] if row is not None else now
            await conn.execute(
                "INSERT INTO consumers (tenant_id, sid, consumer_id, acked, created_at, updated_at)"
                " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (tenant_id, sid, consumer_id)"
                " DO UPDATE SET acked=excluded.acked, updated_at=excluded.updated_at",
                tenant, s["sid"], consumer_id, offset, created, now,
            )
            await self._recount_unread(conn, tenant, s)
            # Producers blocked on credit (in any process) should look again.
            await conn.execute("SELECT pg_notify('yoke_stream', $1)", f"{tenant}|{path}")
        return ConsumerInfo(consumer_id, offset, created, now)

    async def _recount_unread(self, conn: asyncpg.Connection, tenant: str, s: asyncpg.Record) -> None:
        """After consumers changed: move min_ack and keep the unread counters exact."""
        sid, old = s["sid"], s["min_ack"]
        new = await conn.fetchval(
            "SELECT min(acked) FROM consumers WHERE tenant_id=$1 AND sid=$2", tenant, sid
        )
        if new == old:
            return
        if new is None:
            events = size = 0
        elif old is not None and new > old:
            n, b = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(size), 0) FROM events"
                " WHERE tenant_id=$1 AND sid=$2 AND seq > $3 AND seq <= $4",
                tenant, sid, old, new,
            )
            events, size = s["unread_events"] - n, s["unread_bytes"] - b
        else:
            events, size = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(size), 0) FROM events"
                " WHERE tenant_id=$1 AND sid=$2 AND seq > $3",
                tenant, sid, new,
            )
        await conn.execute(
            "UPDATE streams SET min_ack=$3, unread_events=$4, unread_bytes=$5"
            " WHERE tenant_id=$1 AND sid=$2",
            tenant, sid, new, events, size,
        )

    @retry_reads
    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT c.consumer_id, c.acked, c.created_at, c.updated_at FROM consumers c"
                " JOIN streams s ON s.tenant_id = c.tenant_id AND s.sid = c.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 ORDER BY c.consumer_id",
                tenant, path,
            )
        return [consumer_from_row(r) for r in rows]

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool:
        async with self._tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if s is None:
                return False
            status = await conn.execute(
                "DELETE FROM consumers WHERE tenant_id=$1 AND sid=$2 AND consumer_id=$3",
                tenant, s["sid"], consumer_id,
            )
            deleted = status != "DELETE 0"
            if deleted:
                await self._recount_unread(conn, tenant, s)
        return deleted

    # --- large objects ------------------------------------------------------

    _OBJECT_SELECT = (
        f"SELECT {', '.join('o.' + c.strip() for c in OBJECT_COLUMNS.split(','))}, s.sid, s.closed"
        " FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
        " WHERE s.tenant_id=$1 AND s.path=$2 AND o.object_id=$3"
    )

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        async with self._tx(tenant) as conn:
            await self._ensure_stream(conn, tenant, path, new_stream_id, now)
            sid, closed = await conn.fetchrow(
                "SELECT sid, closed FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
            if closed:
                row = await conn.fetchrow(
                    f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=$1 AND sid=$2 AND idempotency_key=$3",
                    tenant, sid, key,
                )
                if row is None:  # a closed stream takes no new object; a retry finds its own
                    raise errors.StreamClosed(f"stream {path} is closed", path=path)
                return object_from_row(path, row)
            await conn.execute(
                "INSERT INTO objects (tenant_id, sid, object_id, idempotency_key, sha256, size,"
                " content_type, state, created_at, expires_at, schema_ref, auth_receipt)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,'prepared',$8,$9,$10,$11::json) ON CONFLICT DO NOTHING",
                tenant, sid, object_id, key, sha256, size, content_type, now, expires_at, schema,
                None if authorization is None else orjson.dumps(authorization).decode(),
            )
            row = await conn.fetchrow(
                f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=$1 AND sid=$2 AND idempotency_key=$3",
                tenant, sid, key,
            )
        return object_from_row(path, row)

    async def upload_object(self, tenant: str, path: str, object_id: str, data: bytes) -> ObjectInfo:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(self._OBJECT_SELECT + " FOR UPDATE OF o", tenant, path, object_id)
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
            await conn.execute(
                "UPDATE objects SET state='uploaded', data=$4 WHERE tenant_id=$1 AND sid=$2 AND object_id=$3",
                tenant, row["sid"], object_id, data,
            )
        return replace(info, state="uploaded")

    @retry_reads
    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(self._OBJECT_SELECT, tenant, path, object_id)
        return object_from_row(path, row) if row else None

    @retry_reads
    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        async with self._tx(tenant) as conn:
            return await conn.fetchval(
                "SELECT o.data FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 AND o.object_id=$3"
                " AND o.state = 'committed'",
                tenant, path, object_id,
            )

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(self._OBJECT_SELECT + " FOR UPDATE OF o", tenant, path, object_id)
            if row is None:
                return None
            info = object_from_row(path, row)
            if info.state == "committed":
                raise errors.ObjectStateConflict(f"object {object_id} is committed", state="committed")
            await conn.execute(
                "UPDATE objects SET state='aborted', data=NULL WHERE tenant_id=$1 AND sid=$2 AND object_id=$3",
                tenant, row["sid"], object_id,
            )
        return replace(info, state="aborted")

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        async with self._tx(tenant) as conn:
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
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT g.first_seq, g.last_seq, g.cause, g.detected_at, g.process FROM gap_evidence g"
                " JOIN streams s ON s.tenant_id = g.tenant_id AND s.sid = g.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 ORDER BY g.detected_at DESC, g.first_seq DESC LIMIT $3",
                tenant, path, limit,
            )
        return [GapEvidence(*r) for r in rows]

    async def pending_deletions(self) -> int:
        return 0  # object bytes are a column of their row: they go with it

    async def cleanup_objects(self, now: int) -> int:
        removed = 0
        for tenant in await self._tenants():
            async with self._tx(tenant) as conn:
                status = await conn.execute(
                    "DELETE FROM objects o USING streams s"
                    " WHERE o.tenant_id = $1 AND s.tenant_id = o.tenant_id AND s.sid = o.sid"
                    " AND NOT s.legal_hold AND o.state != 'committed'"
                    " AND (o.state = 'aborted' OR o.expires_at < $2)",
                    tenant, now,
                )
            removed += int(status.split()[-1])
        return removed

    # --- tokens --------------------------------------------------------------

    async def create_token(self, token: TokenInfo) -> None:
        async with self._tx(token.tenant) as conn:
            await conn.execute(
                f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7)",
                token.token_id, token.tenant, token.name, list(token.scopes), token.secret_hash,
                token.created_at, token.revoked_at,
            )

    @retry_reads
    async def find_token(self, token_id: str) -> TokenInfo | None:
        # The one read across tenants: a SECURITY DEFINER function returning
        # the row of this id (migration 0006); the table's policy is tenant-bound.
        row = await self._fetchrow("SELECT * FROM yoke_find_token($1)", token_id)
        return token_from_row(row) if row else None

    @retry_reads
    async def list_tokens(self, tenant: str) -> list[TokenInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id=$1 ORDER BY created_at, token_id",
                tenant,
            )
        return [token_from_row(r) for r in rows]

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool:
        async with self._tx(tenant) as conn:
            status = await conn.execute(
                "UPDATE tokens SET revoked_at=$3 WHERE tenant_id=$1 AND token_id=$2 AND revoked_at IS NULL",
                tenant, token_id, now,
            )
        return status != "UPDATE 0"

    # --- reads ---------------------------------------------------------------

    @retry_reads
    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._read(tenant, path, after, MAX_OFFSET, limit, max_bytes)

    @retry_reads
    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        if max_bytes is None or max_bytes > ONE_ROW_MAX_BYTES:
            return await self._read(tenant, path, after, MAX_OFFSET, limit, max_bytes, stored_event_from_row)
        # The page in one row (migration 0021): a record of eighteen
        # columns per event was most of a catch-up read's CPU.
        row = await self._fetchrow(
            "SELECT * FROM yoke_read_stored($1, $2, $3, $4, $5)", tenant, path, after, limit, max_bytes
        )
        if row is None:
            return ReadPage(exists=False, head=0, pruned_through=0, events=[])
        head, pruned_through, closed, stream_id, created_at, counted, page = row
        items = orjson.loads(page) if page else []
        return ReadPage(
            exists=True, head=head, pruned_through=pruned_through, closed=closed,
            events=[StoredEvent(i[0], i[1], i[2], None if i[4] is None else bytes.fromhex(i[4])) for i in items],
            sizes=[i[3] for i in items], capped=len(items) < counted, stream_id=stream_id, created_at=created_at,
        )

    @retry_reads
    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        row = await self._fetchrow(
            "SELECT * FROM yoke_read_payloads($1, $2, $3, $4, $5)", tenant, path, after, limit, type
        )
        if row is None:
            return None
        head, closed, _, total, others, last, body = row
        if others or total > max_bytes:
            return None
        return PayloadPage(head, closed, last, body)

    @retry_reads
    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        return await self._read(tenant, path, offset - 1, offset, 1, None)

    async def _read(
        self, tenant: str, path: str, after: int, upto: int, limit: int, max_bytes: int | None,
        make: Callable[..., Any] = event_from_row,
    ) -> ReadPage:
        rows = await self._fetch(
            "SELECT * FROM yoke_read($1, $2, $3, $4, $5, $6)", tenant, path, after, upto, limit, max_bytes
        )
        if not rows:
            return ReadPage(exists=False, head=0, pruned_through=0, events=[])
        head, pruned_through, closed = rows[0][0], rows[0][1], rows[0][2]
        stream_id, created_at = rows[0][15], rows[0][16]
        events: list[Event] = []
        sizes: list[int] = []
        total = 0
        capped = False
        for r in rows:
            if r[3] is None:  # the stream, without events
                continue
            size = r[14]
            if max_bytes is not None and events and total + size > max_bytes:
                capped = True  # yoke_read's one row past the cap
                break
            total += size
            events.append(make(tenant, path, r[3:14], r[17]))
            sizes.append(size)
        return ReadPage(
            exists=True, head=head, pruned_through=pruned_through, events=events, closed=closed,
            sizes=sizes, capped=capped, stream_id=stream_id, created_at=created_at,
        )

    @retry_reads
    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
        return stream_from_row(row) if row else None

    @retry_reads
    async def stream_totals(self, tenant: str) -> StreamTotals:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(head), 0)::bigint FROM streams WHERE tenant_id=$1", tenant
            )
        return StreamTotals(row[0], row[1])

    @retry_reads
    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE tenant_id=$1"
                " AND path LIKE $2 AND path > $3 ORDER BY path LIMIT $4",
                tenant, like_prefix(prefix), after_path or "", limit,
            )
        return [stream_from_row(r) for r in rows]
