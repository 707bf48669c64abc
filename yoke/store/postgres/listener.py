"""LISTEN for appends made by any process, and survive losing the connection.

NOTIFY payloads are ``tenant|path`` only (never event data) and PostgreSQL
delivers them at commit, so a wake-up never precedes the commit it
announces. Notifications sent by this process's own pool connections (the
server pids of its open connections, ``own_pids``) are skipped: the process
woke its readers itself when the commit returned. When the listening
connection dies (database restart, a killed backend), the listener reconnects with backoff, LISTENs again and calls
``on_resync`` so every tail rereads: anything announced while we were deaf
is picked up from the store.

On the relay channel (``relay.py``) it also receives the ephemeral events
other processes append, reassembles them and hands them to
``on_ephemeral``, and answers this process's barrier pings: once a ping
sent after a read comes back, every notification of a commit that read saw
has been handled (PostgreSQL delivers notifications in commit order).
Events relayed while the connection was lost are lost with it (ephemeral
events may be missed like evicted ones); pings waiting then are answered
False.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

import asyncpg

from ... import errors

from ..results import EphemeralCallback, WakeupCallback
from .connection import CONNECT_TIMEOUT_S, connect
from .relay import Reassembly

log = logging.getLogger("yoke.store.postgres.listener")

CHANNEL = "yoke_stream"
QUEUE_CHANNEL = "yoke_queue"  # payload: a tenant whose actor queues got rows
# Payload: 'tenant|path' (the subscriptions of that source changed),
# 'tenant' (leases given up there), or '' (delivering processes came or
# went): delivery engines look again.
SUBSCRIPTION_CHANNEL = "yoke_subscription"
HEALTH_INTERVAL_S = 10.0  # how often an idle listener checks its connection
HEALTH_TIMEOUT_S = 5.0
# The longest pause between reconnect attempts: while deaf, every process
# leans on its sweeps; a failover is over in seconds (docs/production/high-availability.md).
RECONNECT_MAX_S = 1.0


PROBE_TIMEOUT_S = 3.0


async def check_notifications(
    conn: asyncpg.Connection, dsn: str, server_settings: dict[str, str], timeout_s: float = PROBE_TIMEOUT_S
) -> None:
    """Check, once at start, that a notification sent by another connection
    reaches ``conn`` (LISTEN carries every wake-up, and a transaction-mode
    pooler silently drops them: tails and actors would wait for sweeps,
    other processes' ephemeral events would be lost). Simple-protocol
    statements only, so a pooler's refusal of prepared statements cannot
    fail the check first. ``NotificationsLost`` when it does not arrive."""
    channel = f"yoke_probe_{os.urandom(6).hex()}"
    token = os.urandom(8).hex()
    arrived = asyncio.Event()

    def heard(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == token:
            arrived.set()

    await conn.add_listener(channel, heard)
    try:
        other = await connect(dsn, server_settings=server_settings)
        try:
            await other.execute(f"NOTIFY {channel}, '{token}'")
        finally:
            await other.close()
        try:
            async with asyncio.timeout(timeout_s):
                while not arrived.is_set():
                    # A round trip lets a pooler hand over what it holds.
                    await conn.execute("SELECT 1")
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.05):
                            await arrived.wait()
        except TimeoutError:
            raise errors.NotificationsLost(
                f"a notification sent by another connection did not arrive within {timeout_s:g}s: Yoke's"
                " wake-ups ride on LISTEN/NOTIFY, which a pooler in transaction or statement mode"
                " (PgBouncer pool_mode=transaction) cannot carry. Connect Yoke directly to PostgreSQL,"
                " or through a pooler in session mode (docs/production/scaling.md#connection-poolers)"
            ) from None
    finally:
        with contextlib.suppress(Exception):
            await conn.remove_listener(channel, heard)


class Listener:
    def __init__(
        self,
        dsn: str,
        on_wakeup: WakeupCallback,
        on_resync: Callable[[], None],
        on_queue: Callable[[str], None] | None = None,
        on_subscription: Callable[[str], None] | None = None,
        own_pids: set[int] | None = None,
        relay_channel: str | None = None,
        on_ephemeral: EphemeralCallback | None = None,
        server_settings: dict[str, str] | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._server_settings = server_settings  # application_name
        self._on_wakeup = on_wakeup
        self._on_resync = on_resync
        self._on_queue = on_queue
        self._on_subscription = on_subscription
        self._own_pids = own_pids if own_pids is not None else set()
        self._conn: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Condition()
        self.generation = 0  # incremented on every (re)connection
        self.relay_channel = relay_channel
        self.on_ephemeral = on_ephemeral
        self.barriers: dict[str, asyncio.Future[bool]] = {}  # token -> its waiter
        self._reassembly = Reassembly()

    @property
    def backend_pid(self) -> int | None:
        conn = self._conn
        return conn.get_server_pid() if conn is not None and not conn.is_closed() else None

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._supervise(), name="yoke-pg-listener")

    async def close(self) -> None:
        self._lost_relayed()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()

    async def wait_generation(self, at_least: int) -> None:
        """Wait until the listener has (re)connected ``at_least`` times."""
        async with self._connected:
            await self._connected.wait_for(lambda: self.generation >= at_least)

    def _notified(self, _conn: object, pid: int, _channel: str, payload: str) -> None:
        if pid in self._own_pids:
            return  # this process's own commit: it woke its readers already
        tenant, _, path = payload.partition("|")
        self._on_wakeup(tenant, path)

    def _queued(self, _conn: object, pid: int, _channel: str, payload: str) -> None:
        if self._on_queue is not None and pid not in self._own_pids:
            self._on_queue(payload)

    def _subscription(self, _conn: object, pid: int, _channel: str, payload: str) -> None:
        if self._on_subscription is not None and pid not in self._own_pids:
            self._on_subscription(payload)

    def _relayed(self, _conn: object, pid: int, _channel: str, payload: str) -> None:
        if payload.startswith("b:"):
            waiter = self.barriers.pop(payload[2:], None)
            if waiter is not None and not waiter.done():
                waiter.set_result(True)
            return
        if pid in self._own_pids or self.on_ephemeral is None:
            return  # this process buffered its own events when it appended them
        try:
            received = self._reassembly.add(payload)
        except Exception as exc:  # not ours: only Yoke knows the channel
            log.warning("relay channel: a payload that is not an event chunk (%r)", exc)
            return
        if received is not None:
            self.on_ephemeral(*received)

    def _lost_relayed(self) -> None:
        """What was in flight on a lost connection never arrives."""
        self._reassembly.clear()
        for waiter in self.barriers.values():
            if not waiter.done():
                waiter.set_result(False)
        self.barriers.clear()

    def _terminated(self, _conn: object) -> None:
        self._lost.set()

    async def _connect(self) -> None:
        conn = await connect(self._dsn, timeout_s=self._connect_timeout_s, server_settings=self._server_settings)
        try:
            # Clear the loss flag before attaching: a loss from here on is seen.
            self._lost.clear()
            conn.add_termination_listener(self._terminated)
            # A server that hangs just now would hold the LISTENs for ever.
            async with asyncio.timeout(HEALTH_TIMEOUT_S * 2):
                await conn.add_listener(CHANNEL, self._notified)
                await conn.add_listener(QUEUE_CHANNEL, self._queued)
                await conn.add_listener(SUBSCRIPTION_CHANNEL, self._subscription)
                if self.relay_channel is not None:
                    await conn.add_listener(self.relay_channel, self._relayed)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        async with self._connected:
            self.generation += 1
            self._connected.notify_all()

    async def _alive(self) -> bool:
        """A dropped TCP connection can look open: ask the server."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        try:
            await asyncio.wait_for(conn.fetchval("SELECT 1"), HEALTH_TIMEOUT_S)
        except Exception:  # any failure: reconnect (see faults.py for the odd ones)
            return False
        return True

    async def _supervise(self) -> None:
        while True:
            try:
                async with asyncio.timeout(HEALTH_INTERVAL_S):
                    await self._lost.wait()
            except TimeoutError:
                if await self._alive():
                    continue
            log.warning("LISTEN connection lost; reconnecting")
            if self._conn is not None:
                self._conn.terminate()
            self._lost_relayed()
            delay = 0.05
            while True:
                try:
                    await self._connect()
                    break
                except Exception as exc:
                    # Whatever failed (a refused connection, or one cut again
                    # while LISTENing: asyncpg may then raise its
                    # InternalClientError, see faults.py), this task must live on.
                    log.warning("LISTEN reconnect failed: %r; retrying in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)
            # We were deaf for a while: make every tail reread the store.
            self._on_resync()
