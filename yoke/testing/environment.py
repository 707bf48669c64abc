"""The test environment: the real runtime on a temporary database, with a
virtual clock the test moves (docs/basics/testing.md).

Everything that waits for a time waits on the runtime's clock
(``clock.py``: schedules, cron, retry backoffs, the subscriptions' retry
ladder, expiries, retention), so moving the clock runs what fell due.
``advance`` steps through the due times in order, waiting at each for the
system to be idle; ``idle`` waits until nothing is runnable at the current
time; under ``auto_advance``, ``until`` jumps to the next due time whenever
all is idle and what it awaits is not there yet.

What "runnable" and "due" mean is read from the durable rows (the store's
``agenda``, the subscriptions' cursors and retry times) plus the alarms the
runtime's loops are waiting on: no count kept in this process stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from .. import errors
from ..actors.app import App
from ..applications import load
from ..clock import VirtualClock, wall_ms
from ..events import Event
from ..failures.inbox import Failure
from ..http.app import asgi_app, create_app, serve_runtime
from ..runtime import Runtime
from ..runtime import open as open_runtime
from ..store.actors import InstanceInfo, QueueRow
from ..subscriptions.management import SubscriptionStatus

T = TypeVar("T")

# How often idle() looks at the durable rows while something is running (real
# seconds): runs, deliveries and fan-out announce nothing this module hears.
POLL_S = 0.002
DEFAULT_TIMEOUT_S = 30.0


class Environment:
    """One runtime under a virtual clock. ``y``: the runtime (the handle an
    application uses); ``http``: an HTTP client on its API and portals, in
    this process; ``clock``: the virtual clock."""

    def __init__(self, runtime: Runtime, clock: VirtualClock, tenant: str) -> None:
        self.y = runtime
        self.clock = clock
        self.tenant = tenant
        self.auto = False  # auto_advance: until() moves the clock
        self._http: httpx.AsyncClient | None = None

    # --- time -------------------------------------------------------------------

    def now(self) -> dt.datetime:
        """The virtual clock's time (UTC)."""
        return dt.datetime.fromtimestamp(self.clock.wall(), dt.UTC)

    def now_ms(self) -> int:
        """The virtual clock's time in ms since the epoch (how events' ``at`` reads)."""
        return wall_ms(self.clock)

    async def advance(
        self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Move the clock forward by the sum given, running everything that
        falls due on the way in order of due time (each due time is reached,
        and the system left idle there, before the next); returns idle at
        the new time. ``timeout_s``: real seconds the system may take to
        become idle at each step."""
        delta = dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
        if delta < 0:
            raise ValueError("the clock moves forward only")
        await self.idle(timeout_s=timeout_s)
        target = self.clock.wall() + delta
        while (due := await self.next_due()) is not None and due <= target:
            await self._move(due, timeout_s)
        await self._move(target, timeout_s)

    async def down_for(
        self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """As if every process was down that long: the clock jumps without
        stopping at the due times on the way, then what is due runs, as after
        a restart (a cron schedule that missed several firings fires once;
        each retry that fell due runs once)."""
        delta = dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
        if delta < 0:
            raise ValueError("the clock moves forward only")
        await self.idle(timeout_s=timeout_s)
        await self._move(self.clock.wall() + delta, timeout_s)

    async def next_due(self) -> float | None:
        """The earliest time ahead (epoch seconds) something falls due: a
        queued event's retry, a schedule, a subscription's next attempt, or
        an alarm a loop of the runtime waits on. None: nothing waits."""
        now = self.now_ms()
        dues: list[float] = []
        if (alarm := self.clock.next_alarm()) is not None:
            dues.append(alarm)
        store = self.y.store
        for tenant in await store.actors.tenants():
            agenda = await store.actors.agenda(tenant, now)
            if agenda.next_due is not None:
                dues.append(agenda.next_due / 1000)
        for row in await self._subscription_rows():
            if row.halted is None and row.next_retry_at > now:
                dues.append(row.next_retry_at / 1000)
        return min(dues, default=None)

    async def _move(self, to: float, timeout_s: float) -> None:
        if to > self.clock.wall():
            self.clock.set(to)
        await self._passes()
        await self.idle(timeout_s=timeout_s)

    async def _passes(self) -> None:
        """What the runtime does on its own periodically, done now: a
        retention and expiry pass; schedules and queues looked at."""
        await self.y.prune()
        signals = self.y.signals
        signals.timers_changed.emit(None)
        for tenant in await self.y.store.actors.tenants():
            signals.queue_changed.emit(tenant)

    async def idle(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until nothing is runnable at the current time: every event
        fanned out, no queued event due or running, no schedule due, every
        subscription caught up (or halted, or waiting for a retry).
        ``TimeoutError`` (saying what is busy) after ``timeout_s`` real seconds."""
        deadline = time.monotonic() + timeout_s
        quiet_in_a_row = 0
        while True:
            busy = await self.busy()
            # Twice in a row, with the loop's queued callbacks run between:
            # a wake-up announced but not yet handled is not idle.
            quiet_in_a_row = 0 if busy else quiet_in_a_row + 1
            if quiet_in_a_row >= 2:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not idle after {timeout_s}s: {busy}")
            await asyncio.sleep(POLL_S if busy else 0)

    async def busy(self) -> str:
        """What is runnable now, in words ("" when nothing is)."""
        now = self.now_ms()
        said: list[str] = []
        store = self.y.store
        for tenant in await store.actors.tenants():
            agenda = await store.actors.agenda(tenant, now)
            if agenda.runnable:
                said.append(f"{agenda.runnable} actor items in {tenant} (queued, running or fanning out)")
        for row in await self._subscription_rows():
            if row.halted is None and row.cursor < row.head and row.next_retry_at <= now:
                said.append(f"subscription {row.name} of {row.path} in {row.tenant} at {row.cursor} of {row.head}")
        return "; ".join(said)

    async def _subscription_rows(self) -> list[Any]:
        subscriptions = self.y.store.subscriptions
        rows: list[Any] = []
        for tenant in await subscriptions.tenants():
            _, some = await subscriptions.totals(tenant, 100_000)
            rows.extend(some)
        return rows

    @contextlib.asynccontextmanager
    async def auto_advance(self) -> AsyncIterator[None]:
        """Within the block, ``until`` moves the clock itself: whenever the
        system is idle and the outcome awaited is not there yet, the clock
        jumps to the next due time. A test awaits the outcome instead of
        saying how far to move. Time moves only while the test waits, so
        what it does between waits happens at a time it knows."""
        was, self.auto = self.auto, True
        try:
            yield
        finally:
            self.auto = was

    async def until(
        self, check: Callable[[], Awaitable[T]], *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> T:
        """Await ``check()`` until it returns something true, looking again
        whenever the system is idle; under ``auto_advance``, moving the clock
        to the next due time each time it is not true yet. Its value.
        ``TimeoutError`` after ``timeout_s`` real seconds, or (auto-advancing)
        once nothing is due any more."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.idle(timeout_s=max(deadline - time.monotonic(), 0.001))
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true after {timeout_s}s of real time (clock at {self.now().isoformat()})")
            if not self.auto:
                await asyncio.sleep(POLL_S)
                continue
            due = await self.next_due()
            if due is None:
                raise TimeoutError(f"not true, and nothing is due any more (clock at {self.now().isoformat()})")
            await self._move(due, max(deadline - time.monotonic(), 0.001))

    # --- what a test looks at -------------------------------------------------------

    async def instance(self, actor: str, key: str) -> InstanceInfo:
        """The instance of ``actor`` with ``key`` (``InstanceNotFound`` if none)."""
        found = await self.y.instances(self.tenant).find(actor, key)
        if found is None:
            raise errors.InstanceNotFound(f"no instance of {actor} with key {key!r}")
        return found

    async def state(self, actor: str, key: str) -> Any:
        """That instance's ``ctx.state`` document."""
        value, _version = await self.y.instances(self.tenant).state((await self.instance(actor, key)).instance_id)
        return value

    async def query(self, actor: str, key: str, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        """A read-only query of that instance's SQLite tables: its rows as dicts."""
        instances = self.y.instances(self.tenant)
        result = await instances.query((await self.instance(actor, key)).instance_id, sql, params, max_rows=10_000)
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]

    async def sql(self, query: str, params: Any = ()) -> list[dict[str, Any]]:
        """A read-only query across every instance (``y.sql``), once the
        changes of finished runs are in the catalogue: its rows as dicts."""
        await self.y.sql_settled()
        result = await self.y.sql(self.tenant, query, list(params), max_rows=100_000)
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]

    async def dead_letters(self, actor: str, key: str) -> list[QueueRow]:
        """That instance's dead-lettered queue rows."""
        return await self.y.instances(self.tenant).dead((await self.instance(actor, key)).instance_id)

    async def failures(self) -> list[Failure]:
        """The failures inbox: dead letters, halted subscriptions, skipped events."""
        return await self.y.failures(self.tenant).list()

    async def subscription(self, path: str, name: str) -> SubscriptionStatus:
        """A subscription's status (state, cursor, attempts, last error)."""
        return await self.y.stream(path, self.tenant).subscription(name)

    async def events(self, path: str = "/", *, type: str | None = None) -> list[Event]:  # noqa: A002
        """The durable events of a stream (all of them), of one ``type`` when given."""
        stream = self.y.stream(path, self.tenant)
        found: list[Event] = []
        after = 0
        while page := await stream.read(after=after, limit=1000):
            found.extend(e for e in page if type is None or e.type == type)
            after = page[-1].offset
        return found

    @property
    def http(self) -> httpx.AsyncClient:
        """An HTTP client on the API and the portals (``/v1/...``), served in
        this process (no socket; no token needed, as ``yoke serve --dev``)."""
        if self._http is None:
            app = create_app(lambda: contextlib.nullcontext(), dev=True)
            serve_runtime(app, self.y)
            self._http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=asgi_app(app)), base_url="http://yoke.test"
            )
        return self._http

    async def _close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def _start_time(start: dt.datetime | float | None) -> float:
    if start is None:
        return float(int(time.time()))  # now, in whole seconds
    if isinstance(start, dt.datetime):
        return (start if start.tzinfo else start.replace(tzinfo=dt.UTC)).timestamp()
    return float(start)


@contextlib.asynccontextmanager
async def env(
    app: App | str | None = None,
    *,
    start: dt.datetime | float | None = None,
    postgres: bool = False,
    tenant: str = "default",
    auto_advance: bool = False,
    **settings: Any,
) -> AsyncIterator[Environment]:
    """The real runtime with ``app`` (an ``App``, ``"module:attribute"`` or a
    JavaScript application's path)
    on a temporary SQLite file, or, with ``postgres=True``, on a new
    PostgreSQL database made (and dropped) on the server ``YOKE_TEST_PG_URL``
    names; its clock virtual, starting at ``start`` (default: now, in whole
    seconds). ``auto_advance``: on for the whole environment (``until`` moves
    the clock). ``settings``: overrides, as ``yoke.open`` takes them."""
    if isinstance(app, str):
        app = await asyncio.to_thread(load, app)  # a JavaScript app is read by running node
    clock = VirtualClock(_start_time(start))
    async with scratch_database(postgres) as url, open_runtime(url, app=app, clock=clock, **settings) as runtime:
        environment = Environment(runtime, clock, tenant)
        environment.auto = auto_advance
        try:
            yield environment
        finally:
            await environment._close()


@contextlib.asynccontextmanager
async def scratch_database(postgres: bool = False, admin_url: str | None = None) -> AsyncIterator[str]:
    """The URL of a database of its own, removed afterwards: a SQLite file in
    a temporary folder, or a new PostgreSQL database made on the server
    ``admin_url`` (default: ``YOKE_TEST_PG_URL``) names."""
    if not postgres:
        folder = tempfile.mkdtemp(prefix="yoke-test-")
        try:
            yield f"sqlite:///{folder}/yoke.db"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    admin = admin_url or os.environ.get("YOKE_TEST_PG_URL")
    if not admin:
        raise errors.InvalidInput("postgres=True needs YOKE_TEST_PG_URL: a PostgreSQL server's URL to make databases on")
    import asyncpg

    name = f"yoke_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield urlunsplit(urlsplit(admin)._replace(path="/" + name))
    finally:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
