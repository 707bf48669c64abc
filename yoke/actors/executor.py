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
import time
from typing import TYPE_CHECKING, Any

from ..hosts.languages import node_launch, python_launch
from ..hosts.pool import HostPool
from .app import App, app_spec, check_isolation
from .fanout import Fanout
from .portals import run_loop
from .scheduler import Scheduler
from .timers import Timers
from .workers import Membership

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger("yoke.actors.executor")

IDLE_POLL_S = 0.05  # while the store still reports rows (retries due later, other workers)


class Executor:
    def __init__(self, runtime: Runtime, app: App) -> None:
        settings = runtime.settings
        self._runtime = runtime
        self.app = app
        self.worker_id = "wrk_" + secrets.token_hex(8)
        check_isolation(settings.isolation)
        # A pool of hosts per language that has isolated actors; each such
        # actor's runs go to its language's pool.
        by_language: dict[str, list[str]] = {}
        for name, d in app.actors.items():
            if d.language != "python" or (d.isolation or settings.isolation) == "process":
                by_language.setdefault(d.language, []).append(name)
        self.pools: dict[str, HostPool] = {}
        for language, names in by_language.items():
            if language == "python":
                launch = python_launch(app_spec(app))
            else:
                launch = node_launch({n: app.actors[n].script for n in names}, settings.host_memory_mb)
            self.pools[language] = HostPool(
                launch, size=settings.host_processes, runs_per_host=settings.host_runs,
                memory_limit_bytes=settings.host_memory_mb * 2**20,
            )
        self.scheduler = Scheduler(
            runtime, app, self.worker_id,
            max_in_flight=settings.max_in_flight, sweep_s=settings.scheduler_sweep_s,
            shards=settings.claim_shards,
            pools={n: self.pools[lang] for lang, names in by_language.items() for n in names},
        )
        self.fanout = Fanout(
            runtime, app, self.worker_id, self.scheduler.wake, sweep_s=settings.scheduler_sweep_s
        )
        self.timers = Timers(runtime, poll_s=settings.schedule_poll_s, on_enqueued=self.scheduler.wake)
        self.membership = Membership(
            runtime, self.worker_id,
            heartbeat_s=settings.worker_heartbeat_s, stale_s=settings.worker_stale_s,
            on_adopted=self.scheduler.wake, on_evicted=self._evicted, actors=list(app.actors),
        )
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def hosts(self) -> HostPool | None:
        """The pool of Python hosts (None without isolated Python actors)."""
        return self.pools.get("python")

    def _evicted(self) -> None:
        self.scheduler.forget_instances()
        self._runtime.state_databases().forget_all()

    def _resync(self) -> None:
        self.fanout.resync()
        self.scheduler.wake()

    async def start(self) -> None:
        await self.membership.register()
        hub = self._runtime.hub
        hub.observers.append(self.fanout.appended)
        hub.resync_observers.append(self._resync)
        store = self._runtime.store
        listener = getattr(store, "listener", None)
        if listener is not None:
            listener.on_queue = self.scheduler.wake
        jobs = {
            "fanout": self.fanout.run(),
            "scheduler": self.scheduler.run(),
            "membership": self.membership.run(),
            "timers": self.timers.run(),
        }
        for portal in self.app.portals.values():
            if portal.start_fn is not None:
                jobs[f"portal-{portal.name}"] = run_loop(self._runtime, portal)
        for pool in self.pools.values():
            pool.warm()
        for pool in self.pools.values():
            await pool.ready()  # runs should not start by waiting for hosts
        for name, job in jobs.items():
            self._tasks.append(asyncio.create_task(job, name=f"yoke-{name}"))

    async def stop(self, timeout_s: float) -> None:
        hub = self._runtime.hub
        with contextlib.suppress(ValueError):
            hub.observers.remove(self.fanout.appended)
            hub.resync_observers.remove(self._resync)
        await self.scheduler.stop(timeout_s)
        for pool in self.pools.values():
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
        deadline = time.monotonic() + timeout_s

        async def quiet() -> None:
            while True:
                await self.fanout.idle.wait()
                await self.scheduler.wait_quiet()
                if self.fanout.idle.is_set():
                    return

        while True:
            # This process looks idle first; then the store must agree (rows
            # may wait for a retry, or belong to instances of other workers).
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0)):
                    await quiet()
            except TimeoutError:
                raise TimeoutError(f"not idle after {timeout_s}s") from None
            if await self._runtime.store.actors.unfinished(list(self.app.actors)) == 0:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"not idle after {timeout_s}s")
            await asyncio.sleep(IDLE_POLL_S)
