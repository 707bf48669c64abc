"""Server backend: PostgreSQL through asyncpg.

Every query runs as the ``yoke_runtime`` role (no BYPASSRLS, owning no
table) with the tenant set per transaction, so row-level security isolates
tenants whatever the query. The hot paths (group commit, reads) are single round trips into the
SQL functions defined in the migrations (their current text: functions/).

``PostgresStore`` is the assembly of its parts, one concern a module, each
built on the one ``PgDb`` (connection.py: the pools, one statement or one
transaction under a tenant, faults made ``Unavailable``):

    appends.py          yoke_append's arguments and outcomes; appends in a transaction
    streams.py          create, settings, delete, retention, info, gap evidence
    reads.py            pages of events
    consumers.py        acknowledgements and the unread counters
    objects.py          large objects
    tokens.py           API tokens
    actors.py, subscriptions.py, durable_streams.py, outbox.py
                        the sub-stores of the contract (``store.actors``...)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import asyncpg

from ... import errors
from ...clock import SYSTEM, Clock
from ...events import PreparedEvent
from ..durable_streams import OK, Guard, one_lifetime
from ..parts import ConcernParts
from ..results import (
    CommitResult,
    EphemeralCallback,
    WakeupCallback,
)
from ..schema import check_startable
from .actors import PgActorStore
from .catalogue import SQL_QUERY_CONNECTIONS, PgCatalogue
from .appends import APPEND, APPEND_IN_LIFETIME, APPEND_RELAY, PgAppends, append_args, commit_result
from .connection import COMMAND_TIMEOUT_S, CONNECT_TIMEOUT_S, PgDb, connect, connect_failed
from .forks import PgForks
from .inputs import PgInputs
from .consumers import PgConsumers
from .durable_streams import PgProtocolStore
from .listener import Listener, check_notifications
from .migrate import grants_hint, migrate, missing_grants, pending, privilege_hint, sync_role
from .migrate import status as migration_status
from .objects import PgObjects
from .outbox import PgOutboxStore
from .reads import PgReads
from .relay import encode as encode_relayed
from .streams import PgStreams
from .subscriptions import PgSubscriptionStore
from .tokens import PgTokens

log = logging.getLogger("yoke.store.postgres")


def with_user(dsn: str, user: str, password: str = "") -> str:
    """The same servers and database, logged in as ``user`` (with ``password``
    when given). The hosts are kept as written: a multi-host list
    (``h1:5432,h2:5433``), an IPv6 address or none (a Unix socket named in
    the query); a ``user`` or ``password`` in the query gives way."""
    parts = urlsplit(dsn)
    hosts = parts.netloc.rpartition("@")[2]
    login = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in LOGIN_PARAMS])
    return urlunsplit(parts._replace(netloc=f"{login}@{hosts}", query=query))


LOGIN_PARAMS = ("user", "password")


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


class PostgresStore(ConcernParts):
    """``contract.Store`` on PostgreSQL."""

    relays_ephemeral = True

    async def others_committed(self) -> bool:
        """Never asked to look: other processes' commits arrive as NOTIFYs
        (``listener.py``)."""
        return False

    def __init__(
        self,
        dsn: str,
        *,
        role: str = "yoke_runtime",
        role_password: str = "",
        runtime_dsn: str | None = None,
        pool_min: int = 2,
        pool_max: int = 10,
        migrate: bool = True,
        application_name: str = "yoke",
        statement_timeout_s: float = 0.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        clock: Clock = SYSTEM,
    ) -> None:
        self.dsn = dsn  # used for migrations
        self.role = role
        self.role_password = role_password
        self.runtime_dsn = runtime_dsn
        self.migrate = migrate  # False: --no-migrate (pending migrations refuse the start)
        # Every connection says which kind of process it serves (pg_stat_activity).
        self._named = {"application_name": application_name[:63]}
        # Runtime connections only: migrations may rewrite whole tables.
        runtime_settings = dict(self._named)
        if statement_timeout_s > 0:
            runtime_settings["statement_timeout"] = str(max(1, round(statement_timeout_s * 1000)))
        self._connect_timeout_s = connect_timeout_s
        db = self.db = PgDb(
            pool_min=pool_min, pool_max=pool_max, server_settings=runtime_settings, clock=clock,
            connect_timeout_s=connect_timeout_s, command_timeout_s=command_timeout_s,
        )
        appends = PgAppends(db)
        self._streams = PgStreams(db, appends)
        self._reads = PgReads(db)
        self._consumers = PgConsumers(db)
        self._objects = PgObjects(db, appends)
        self._tokens = PgTokens(db)
        self.listener: Listener | None = None
        self.actors = PgActorStore(db, appends)
        self.subscriptions = PgSubscriptionStore(db, appends)
        self.protocol = PgProtocolStore(db, appends)
        self.outbox = PgOutboxStore(db, appends)
        self.catalogue = PgCatalogue(db)
        self.inputs = PgInputs(db)
        self.forks = PgForks(db)
        self._relay_channel: str | None = None  # secret: migration 0008
        self._barrier_prefix = os.urandom(6).hex()
        self._barriers = itertools.count()

    # --- lifecycle ----------------------------------------------------------

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None, *,
        on_queue: Callable[[str], None] | None = None,
        on_subscription: Callable[[str], None] | None = None,
    ) -> None:
        try:
            conn = await connect(self.dsn, timeout_s=self._connect_timeout_s, server_settings=self._named)
        except Exception as exc:
            raise connect_failed(exc) from exc
        try:
            # First, before any prepared statement: a transaction-mode
            # pooler is named, not met as a stray protocol error later.
            await check_notifications(conn, self.dsn, self._named)
            await self._prepare_schema(conn)
            hand_over = await rls_escape(conn) is not None
            if hand_over and self.migrate:  # as the owner: the runtime role gets what it needs
                await sync_role(conn, self.role, self.role_password)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise errors.DatabasePrivileges(await privilege_hint(conn, exc)) from exc
        finally:
            await conn.close()
        # The runtime must log in as a role that row-level security binds:
        # never the tables' owner, nor a superuser or BYPASSRLS login. Such a
        # migration login hands over to the runtime role (same server and
        # database; YOKE_PG_RUNTIME_URL to set credentials).
        derived = self.runtime_dsn is None and hand_over
        pool_dsn = self.runtime_dsn or (
            with_user(self.dsn, self.role, self.role_password) if hand_over else self.dsn
        )
        try:
            await self.db.open_pool(pool_dsn)
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            if not derived:
                raise connect_failed(exc) from exc
            raise errors.YokeError(
                f"the PostgreSQL runtime role {self.role} could not log in ({exc}): the"
                " migration login owns the tables or bypasses row-level security, so the"
                f" runtime logs in as {self.role}; give its password in YOKE_PG_ROLE_PASSWORD"
                " (or its credentials in YOKE_PG_RUNTIME_URL)"
            ) from exc
        except Exception as exc:
            raise connect_failed(exc) from exc
        await self.db.open_beats(pool_dsn)
        await self.db.open_queries(pool_dsn, SQL_QUERY_CONNECTIONS)
        try:
            async with self.db.connection() as check:
                escape = await rls_escape(check)
                if escape is None:
                    lacking = await missing_grants(check)
                    if lacking:
                        raise errors.DatabasePrivileges(
                            grants_hint(await check.fetchval("SELECT session_user"), lacking)
                        )
                    self._relay_channel = await check.fetchval("SELECT channel FROM yoke_relay")
        except BaseException:
            await self.db.close()
            raise
        if escape is not None:
            await self.close()
            raise errors.YokeError(
                f"the PostgreSQL runtime login would get past row-level security: {escape};"
                " log the runtime in as a role that neither owns Yoke's tables nor has"
                " SUPERUSER or BYPASSRLS (the default yoke_runtime; YOKE_PG_ROLE, YOKE_PG_RUNTIME_URL)"
            )
        self.listener = Listener(
            pool_dsn, on_wakeup, on_resync, on_queue=on_queue, on_subscription=on_subscription,
            own_pids=self.db.own_pids, relay_channel=self._relay_channel, on_ephemeral=on_ephemeral,
            server_settings=self._named, connect_timeout_s=self._connect_timeout_s,
        )
        try:
            await self.listener.start()
        except Exception as exc:
            self.listener = None
            await self.close()
            raise connect_failed(exc) from exc

    async def _prepare_schema(self, conn: asyncpg.Connection) -> None:
        """Apply this build's pending migrations, or with ``--no-migrate``
        (which changes nothing in the database, grants included: `yoke
        migrate` made them) check that none is pending; either way refuse a
        newer build's schema."""
        if self.migrate:
            await migrate(conn)
        else:
            check_startable(await migration_status(conn), migrated=False)

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        await self.db.close()

    async def ready(self) -> None:
        async with self.db.connection() as conn:
            missing = await pending(conn)
        if missing:
            raise errors.YokeError(f"migrations not applied: {', '.join(missing)}")

    async def schema_version(self) -> int:
        return int(await self.db.fetchval("SELECT coalesce(max(version), 0) FROM yoke_schema_version"))  # type: ignore[arg-type]

    @property
    def pool(self) -> asyncpg.Pool:
        return self.db.pool

    def pool_sizes(self) -> tuple[int, int, int] | None:
        """(connections, idle, max) of the pool, from memory; None before start."""
        return self.db.pool_sizes()

    # --- the append (the hot path: one statement) ----------------------------

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
                args = append_args(tenant, path, events, batch_of, now, new_stream_id)
                rows = await self.db.fetch(APPEND_IN_LIFETIME, *args, lifetime)
                if rows:
                    result = commit_result(rows, events)
                    return CommitResult(outcomes=result.outcomes, head=result.head, guards=[OK] * len(guards))
            # Checks of producers, Stream-Seq or a close, or a lifetime no
            # longer at the path: decided batch by batch.
            return await self.protocol.commit_guarded(tenant, path, events, batch_of, now, new_stream_id, guards)
        args = append_args(tenant, path, events, batch_of, now, new_stream_id)
        if any(e.ephemeral for e in events):
            # yoke_append_relay: the first 18 (no p_kernel, no p_data: ephemeral events carry no bytes)
            owners, chunks = encode_relayed(tenant, path, now, events)
            rows = await self.db.fetch(APPEND_RELAY, *args[:18], self._relay_channel, owners, chunks)
        else:
            rows = await self.db.fetch(APPEND, *args)
        return commit_result(rows, events)

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        listener = self.listener
        if listener is None:
            return False
        token = f"{self._barrier_prefix}{next(self._barriers):x}"
        waiter = listener.barriers[token] = asyncio.get_running_loop().create_future()
        try:
            await self.db.execute("SELECT pg_notify($1, $2)", self._relay_channel, "b:" + token)
            async with asyncio.timeout(timeout_s):
                return await waiter
        except (TimeoutError, errors.Unavailable):
            return False
        finally:
            listener.barriers.pop(token, None)
