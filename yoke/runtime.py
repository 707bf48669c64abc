"""The Runtime: assembles the store and the stream services.

``yoke.open(url)`` is the entry point::

    async with yoke.open("sqlite:///./.yoke/yoke.db") as y:
        await y.stream("/orders").append({"type": "order.placed"})
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from . import errors
from .actors.app import App, app_spec
from .actors.executor import Executor
from .actors.instances import Instances
from .failures import Failures
from .actors.state import StateDatabases, make_storage
from .config import Settings
from .events import MAX_PATH_CHARS, validate_path, validate_tenant
from .hosts.reload import CodeWatch
from .store import Store, StreamInfo, connect_store
from .streams.append import AppendService
from .streams.connections import Connections
from .streams.ephemeral import EphemeralBuffers
from .streams.handle import Stream
from .streams.gaps import Gaps
from .streams.inputs import InputDispatcher
from .streams.relay import EphemeralRelay
from .streams.retention import prune_forever, prune_once
from .streams.tail import SharedReads
from .streams.wakeups import WakeupHub
from .store.faults import log_retried
from .subscriptions.engine import Deliveries
from .subscriptions.operator import rebuild_stale_catalogues
from .tokens import Tokens

log = logging.getLogger("yoke.runtime")


class Runtime:
    def __init__(self, settings: Settings, app: App | None = None, *, executor: bool = True) -> None:
        self.settings = settings
        self.app = app
        # An app that registers only subscription receivers needs no fan-out,
        # scheduler or membership (they would cost every append a fan-out pass).
        self._want_executor = executor and app is not None and bool(app.actors or app.portals)
        self._want_deliveries = executor  # copies and webhooks need no app
        self.executor: Executor | None = None
        self.deliveries: Deliveries | None = None
        # --reload: the application's code, watched (hosts/reload.py).
        self.code: CodeWatch | None = None
        if settings.reload and app is not None:
            self.code = CodeWatch(app_spec(app), [d.script for d in app.actors.values() if d.script])
        self.catalogues: asyncio.Task[list[tuple[str, str]]] | None = None  # the check on open
        self._state_dbs: StateDatabases | None = None
        self._store: Store = connect_store(settings)
        self.hub = WakeupHub()
        self.buffers = EphemeralBuffers.from_settings(settings)
        self.relay = EphemeralRelay(self.buffers, self.hub)
        self.relay.store = self._store
        self.shared_reads = SharedReads(self.hub)
        self.connections = Connections(self)
        self.appends = AppendService(
            self._store, self.hub, self.buffers, max_group_events=settings.max_group_events
        )
        self.tokens = Tokens(self._store)
        self.inputs = InputDispatcher(self)
        self.gaps = Gaps(self)
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False

    @property
    def store(self) -> Store:
        """The storage backend; ``RuntimeClosed`` once the runtime is shut down."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return self._store

    @property
    def closed(self) -> bool:
        return not self._started

    async def start(self) -> None:
        await self._store.start(
            on_wakeup=self.hub.wake, on_resync=self.hub.resync, on_ephemeral=self.relay.receive
        )
        self._started = True
        if self._want_executor:
            assert self.app is not None
            try:
                # Constructing it checks the app (hosts' scripts, isolation): a refusal closes the store too.
                self.executor = Executor(self, self.app)
                await self.executor.start()
            except BaseException:
                await self.close()
                raise
        if self._want_deliveries:
            self.deliveries = Deliveries(self)
            await self.deliveries.start()
            # Subscription catalogues missing, invalid or from another reducer
            # version are rebuilt from their logs (in the background, resumably).
            self.catalogues = asyncio.create_task(self._rebuild_catalogues(), name="yoke-catalogues")
            self._tasks.append(self.catalogues)
        if self.code is not None:
            self._tasks.append(asyncio.create_task(self.code.run(self._code_changed), name="yoke-reload"))
        self._tasks.append(
            asyncio.create_task(
                prune_forever(self._store, self.settings.prune_interval_s), name="yoke-retention"
            )
        )
        self._tasks.append(
            asyncio.create_task(self.hub.sweep_forever(self.settings.tail_sweep_s), name="yoke-tail-sweep")
        )
        if self.settings.input_dispatch_s > 0:
            self._tasks.append(asyncio.create_task(
                self.inputs.run_forever(self.settings.input_dispatch_s), name="yoke-input-dispatch"
            ))

    def _code_changed(self, version: str) -> None:
        """--reload saw new code: new hosts for new runs, a new deploy version."""
        if self.executor is not None:
            for pool in self.executor.pools.values():
                pool.recycle()
        if self.deliveries is not None:
            self.deliveries.redeployed(version)

    async def close(self) -> None:
        """Stop accepting appends, finish the queued ones, stop background work."""
        if not self._started:
            return
        await self.connections.close_all()  # their ends recorded while the store is open
        if self.executor is not None:
            # Runs finish first: they may still append.
            await self.executor.stop(self.settings.shutdown_timeout_s)
            self.executor = None
        if self.deliveries is not None:
            # An interrupted delivery is sent again by whoever takes the lease.
            await self.deliveries.stop()
            self.deliveries = None
        if self._state_dbs is not None:
            await self._state_dbs.close()
            self._state_dbs = None
        self.appends.closing = True
        self.appends.stop_blocking()
        await self.appends.drain()
        self._started = False  # from here on the store raises RuntimeClosed
        self.hub.wake_all()  # tails notice and end
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._store.close()

    def stream(self, path: str, tenant: str = "default") -> Stream:
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Stream(self, path, tenant)

    async def streams(
        self, tenant: str = "default", prefix: str = "/", *, limit: int = 1000, after: str | None = None
    ) -> list[StreamInfo]:
        """Streams of ``tenant`` whose path starts with ``prefix``, by path."""
        validate_tenant(tenant)
        if (
            not isinstance(prefix, str) or not prefix.startswith("/") or "\x00" in prefix
            or len(prefix) > MAX_PATH_CHARS
        ):
            raise errors.InvalidPath(
                "a prefix starts with '/', has no NUL and at most 512 characters", path=str(prefix)[:80]
            )
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise errors.InvalidInput("limit must be 1-10000", field="limit")
        if after is not None:
            validate_path(after)
        return await self.store.list_streams(tenant, prefix, limit, after)

    # --- actors ----------------------------------------------------------------

    @property
    def worker_id(self) -> str | None:
        """This process's worker id when it runs an executor (new instances go to it)."""
        return None if self.executor is None else self.executor.worker_id

    def instances(self, tenant: str = "default") -> Instances:
        """Actor instances of ``tenant``: create, list, inspect, dead letters."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Instances(self, tenant)

    def failures(self, tenant: str = "default") -> Failures:
        """The failures inbox of ``tenant``: dead letters, halted subscriptions
        and skipped events, listed, replayed and discarded in one place."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Failures(self, tenant)

    def state_databases(self) -> StateDatabases:
        if self._state_dbs is None:
            storage = make_storage(
                self.settings.storage, store=self.store.actors, data_dir=self.settings.data_dir,
                settings=self.settings, postgres=not self.settings.database_url.startswith("sqlite"),
            )
            self._state_dbs = StateDatabases(storage)
        return self._state_dbs

    async def _rebuild_catalogues(self) -> list[tuple[str, str]]:
        try:
            return await rebuild_stale_catalogues(self)
        except errors.RuntimeClosed:
            return []
        except Exception:
            log_retried(log, "checking the subscription catalogues failed")
            return []

    async def stream_deleted(self, tenant: str, path: str) -> None:
        """What this process remembers of a deleted stream goes: its buffered
        ephemeral events (an ephemeral commit in flight is waited for, its
        events dropped too), the fan-out cursor it cached and the runners of
        its subscriptions; its tails wake, read and end."""
        buffer = self.buffers.get(tenant, path)
        if buffer is not None:
            self.buffers.discard(tenant, path)
            await buffer.settled()
            self.buffers.discard(tenant, path)
        self.relay.forget(tenant, path)
        if self.executor is not None:
            self.executor.fanout.forget(tenant, path)
        if self.deliveries is not None:
            self.deliveries.stream_deleted(tenant, path)
        self.hub.wake(tenant, path)
        self.hub.wake(tenant, "/")  # the yoke.stream.deleted fact

    def routing_changed(self, tenant: str) -> None:
        if self.executor is not None:
            self.executor.fanout.routing_changed(tenant)

    def queue_changed(self, tenant: str) -> None:
        if self.executor is not None:
            self.executor.scheduler.wake(tenant)

    def timers_changed(self) -> None:
        if self.executor is not None:
            self.executor.timers.changed()

    async def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Return once fan-out has caught up and no queue row is pending or
        processing (dead rows excepted). For tests and scripts; needs an app."""
        if self.executor is None:
            raise errors.InvalidInput("wait_idle needs a runtime opened with an app that has actors")
        await self.executor.wait_idle(timeout_s)

    async def ready(self) -> None:
        """Raise unless the store answers and is migrated (used by /readyz)."""
        await self.store.ready()

    async def prune(self) -> int:
        """Run one retention pass now; returns the number of events removed."""
        return await prune_once(self.store)


@contextlib.asynccontextmanager
async def open(  # noqa: A001
    url: str | None = None,
    *,
    app: App | None = None,
    executor: bool = True,
    settings: Settings | None = None,
    **overrides: Any,
) -> AsyncIterator[Runtime]:
    """Open a runtime on ``url`` (default: ``YOKE_DATABASE_URL`` or
    ``sqlite:///./.yoke/yoke.db``). With ``app``, the runtime also runs the
    application's actors in this process (fan-out, scheduler, schedules,
    portal loops) unless ``executor=False``. Keyword arguments override
    settings; ``settings`` gives them all at once."""
    if settings is None:
        settings = Settings.from_env(database_url=url, **overrides)
    runtime = Runtime(settings, app, executor=executor)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()
