"""The executor: fan-out, scheduler, schedules, worker membership and
portal loops of one process, started and stopped together.

``yoke.open(url, app=app)``, ``yoke serve --app`` and ``yoke worker --app``
run one. ``yoke serve --no-executor`` runs none: appends are stored
without fan-out and an executor elsewhere catches up from the cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

from .. import errors
from ..clock import wall_ms
from ..hosts.languages import node_launch, python_launch
from ..hosts.pool import HostPool
from .app import App, app_spec, check_isolation
from .busy import busy_report
from .fanout import Fanout
from .history_retention import HistoryRetention
from .kernel import ActorKernel
from .portals import run_loop
from .scheduler import Scheduler
from .schedules import Timers
from .membership import Membership

log = logging.getLogger("yoke.actors.executor")

IDLE_POLL_S = 0.05  # while the store still reports rows (retries due later, other workers)


class Executor:
    """Built from the actor kernel (kernel.py) and the application. While it
    runs it listens to the hub (appends, resyncs) and to the kernel's
    signals: routing, queues and timers changed, streams deleted, new code."""

    def __init__(self, kernel: ActorKernel, app: App, *, code_version: str | None = None) -> None:
        settings = kernel.settings
        self._kernel = kernel
        self.app = app
        self.worker_id = "wrk_" + secrets.token_hex(8)
        check_isolation(settings.isolation)
        # A pool of hosts per language that has isolated actors; each such
        # actor's runs go to its language's pool.
        by_language: dict[str, list[str]] = {}
        for name, d in app.actors.items():
            if d.language != "python" or (d.isolation or settings.isolation) == "process":
                by_language.setdefault(d.language, []).append(name)
        # Portals and receivers written for a host (node_calls.py) run in its pool too.
        node_portals = {p.name: p.script for p in app.portals.values() if p.language == "node" and p.script}
        node_receivers = {n: f.script for n, f in app.receivers.items() if getattr(f, "language", None) == "node"}
        if node_portals or node_receivers:
            by_language.setdefault("node", [])
        self.pools: dict[str, HostPool] = {}
        for language, names in by_language.items():
            if language == "python":
                launch = python_launch(app_spec(app))
            else:
                launch = node_launch({n: app.actors[n].script for n in names}, settings.host_memory_mb, node_portals,
                                     node_receivers)
            # A portal's start loop holds a host for good: one more for each,
            # so the loops never starve the runs.
            loops = sum(1 for p in app.portals.values() if p.language == language and p.start_fn is not None)
            self.pools[language] = HostPool(
                launch, size=settings.host_processes + loops, runs_per_host=settings.host_runs,
                memory_limit_bytes=settings.host_memory_mb * 2**20,
            )
        app.hosts.update(self.pools)  # node_calls.py finds the Node pool there
        self.scheduler = Scheduler(
            kernel, app, self.worker_id,
            max_in_flight=settings.max_in_flight, sweep_s=settings.scheduler_sweep_s,
            shards=settings.claim_shards,
            pools={n: self.pools[lang] for lang, names in by_language.items() for n in names},
            code_version=settings.deploy_version or app.version or code_version,
        )
        self.history_retention = HistoryRetention(kernel, list(app.actors.values()))
        self.fanout = Fanout(
            app, self.worker_id, self.scheduler.wake, store=kernel.actors, read=kernel.read, hub=kernel.hub,
            evaluations=kernel.evaluations, sweep_s=settings.scheduler_sweep_s, clock=kernel.clock,
        )
        self.timers = Timers(
            kernel.actors, kernel.stream, poll_s=settings.schedule_poll_s, on_enqueued=self.scheduler.wake,
            clock=kernel.clock,
        )
        self.membership = Membership(
            kernel.actors, kernel.hub, self.worker_id,
            heartbeat_s=settings.worker_heartbeat_s, stale_s=settings.worker_stale_s,
            on_adopted=self.scheduler.wake, on_evicted=self._evicted, actors=list(app.actors),
            on_released=self._released, clock=kernel.clock,
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self._disconnect: list[Callable[[], None]] = []

    @property
    def hosts(self) -> HostPool | None:
        """The pool of Python hosts (None without isolated Python actors)."""
        return self.pools.get("python")

    def _evicted(self) -> None:
        self.scheduler.forget_instances()
        self._kernel.state_databases().forget_all()

    def _released(self, tenant: str, instance_ids: list[str]) -> None:
        """Instances given up to other workers: their cached databases go (a
        later adoption back loads what the others wrote)."""
        states = self._kernel.state_databases()
        for instance_id in instance_ids:
            states.forget(tenant, instance_id)

    def _resync(self) -> None:
        self.fanout.resync()
        self.scheduler.wake()

    async def _stream_deleted(self, tenant: str, path: str) -> None:
        self.fanout.forget(tenant, path)

    def _code_changed(self, version: str) -> None:
        """--reload saw new code: new hosts for new runs."""
        for pool in self.pools.values():
            pool.recycle()
        if not (self._kernel.settings.deploy_version or self.app.version):
            self.scheduler.code_version = version  # the inputs it runs from now on

    async def start(self) -> None:
        await self.membership.register()
        hub = self._kernel.hub
        hub.observers.append(self.fanout.appended)
        hub.resync_observers.append(self._resync)
        signals = self._kernel.signals
        self._disconnect = [
            signals.routing_changed.connect(self.fanout.routing_changed),
            signals.queue_changed.connect(self.scheduler.wake),
            signals.timers_changed.connect(self.timers.changed),
            signals.stream_deleted.connect(self._stream_deleted),
            signals.code_changed.connect(self._code_changed),
        ]
        jobs = {
            "fanout": self.fanout.run(),
            "scheduler": self.scheduler.run(),
            "membership": self.membership.run(),
            "timers": self.timers.run(),
            "history-retention": self.history_retention.run(),
        }
        for portal in self.app.portals.values():
            if portal.start_fn is not None:
                jobs[f"portal-{portal.name}"] = run_loop(
                    self._kernel, self.app, portal, worker_id=self.worker_id
                )
        for pool in self.pools.values():
            pool.warm()
        for pool in self.pools.values():
            await pool.ready()  # runs should not start by waiting for hosts
        for name, job in jobs.items():
            self._tasks.append(asyncio.create_task(job, name=f"yoke-{name}"))

    async def stop(self, timeout_s: float) -> None:
        hub = self._kernel.hub
        with contextlib.suppress(ValueError):
            hub.observers.remove(self.fanout.appended)
            hub.resync_observers.remove(self._resync)
        for disconnect in self._disconnect:
            disconnect()
        self._disconnect = []
        await self.scheduler.stop(timeout_s)
        for language, pool in self.pools.items():
            if self.app.hosts.get(language) is pool:
                del self.app.hosts[language]
            await pool.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        try:
            await self.membership.leave()
        except Exception:
            log.exception("could not unregister worker %s", self.worker_id)

    async def wait_idle(self, timeout_s: float) -> None:
        """Return once fan-out has caught up and no queue row is pending or
        processing (dead rows excepted); ``TimeoutError`` otherwise."""
        clock = self._kernel.clock
        deadline = clock.monotonic() + timeout_s

        async def quiet() -> None:
            while True:
                await self.fanout.idle.wait()
                await self.scheduler.wait_quiet()
                if self.fanout.idle.is_set():
                    return

        while True:
            # This process looks idle first; then the store must agree (rows
            # may wait for a retry, or belong to instances of other workers).
            remaining = deadline - clock.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0)):
                    await quiet()
            except TimeoutError:
                raise TimeoutError(await self._not_idle(timeout_s)) from None
            if await self._kernel.actors().unfinished(list(self.app.actors)) == 0:
                return
            if clock.monotonic() >= deadline:
                raise TimeoutError(await self._not_idle(timeout_s))
            await asyncio.sleep(IDLE_POLL_S)

    async def _not_idle(self, timeout_s: float) -> str:
        try:
            report = await busy_report(self._kernel.actors(), list(self.app.actors), wall_ms(self._kernel.clock))
        except errors.Unavailable as exc:  # the timeout stays the answer; the report is a courtesy
            report = f"(what is busy could not be read: {exc.message})"
        return f"not idle after {timeout_s}s: {report}"
