"""Worker membership: many processes sharing one database.

Each executor registers in ``runtime_workers`` and heartbeats. A worker owns
the instances it creates and adopts unowned ones up to a fair share,
giving up those beyond it when more workers join (never one with a row
running: see ``ActorStore.release_excess``); a worker silent for more than
``worker_stale_s`` is reaped and its instances become unowned, so live
workers adopt them. Rows the dead worker was
processing come back when their leases expire (a lease outlives the
actor's timeout), so a worker that only looked dead cannot run a row at the
same time as its successor.

Two loops, so that nothing slow delays a heartbeat: the beat (heartbeat,
then reap the silent) runs on a task of its own from registration on and,
on PostgreSQL, a connection of its own, every ``worker_heartbeat_s``; the
adoption pass (every tenant in turn, however many) runs on the pool, on
another task. Times come from the
database's clock, so a reap is decided on one clock for every process, and
only after ``worker_stale_s`` of silence: many missed beats, not one late
one. Reaps and rejoins are logged with their reasons and counted
(``yoke_worker_reaps_total``, ``yoke_worker_rejoins_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import metrics
from ..clock import SYSTEM, Clock
from ..lifecycle import GLOBAL
from ..store.faults import log_retried

if TYPE_CHECKING:
    from ..store.actors import ActorStore
    from ..streams.wakeups import WakeupHub

log = logging.getLogger("yoke.actors.membership")

MIN_BEATS_PER_STALE = 3  # worker_stale_s should span at least this many heartbeats


class Membership:
    """``store()``: the actor store; ``hub``: tails of ``/`` hear of adoptions."""

    def __init__(
        self, store: Callable[[], ActorStore], hub: WakeupHub, worker_id: str, *, heartbeat_s: float,
        stale_s: float, on_adopted: Callable[[str], None], on_evicted: Callable[[], None],
        actors: list[str], on_released: Callable[[str, list[str]], None] | None = None, clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._hub = hub
        self._clock = clock
        self.worker_id = worker_id
        self._heartbeat_s = heartbeat_s
        self._stale_s = stale_s
        self._on_adopted = on_adopted
        self._on_evicted = on_evicted
        self._on_released = on_released
        self._actors = actors  # adopt only instances this worker can run
        self._info = {"host": socket.gethostname(), "pid": os.getpid()}
        self._adopt = asyncio.Event()  # the set of workers changed: adopt now
        self._beating: asyncio.Task[None] | None = None
        # Since the last beat that went through (monotonic): why a reap of
        # this worker happened, if one did.
        self._last_ok = clock.monotonic()
        self._failed = 0  # beats that failed
        self._latest = 0.0  # the most a beat started after it was due
        if stale_s < MIN_BEATS_PER_STALE * heartbeat_s:
            log.warning(
                "worker_stale_s (%s) spans fewer than %d heartbeats of worker_heartbeat_s (%s):"
                " a few late beats get a live worker reaped", stale_s, MIN_BEATS_PER_STALE, heartbeat_s,
            )

    async def register(self) -> None:
        """Join, start heartbeating, then adopt a first share.

        The beat starts the moment the row exists: the first adoption pass
        (every tenant) and whatever the executor does before it runs (warming
        host processes) can take longer than ``worker_stale_s`` on a loaded
        machine, and a worker silent that long is reaped by its peers."""
        await self._store().register_worker(self.worker_id, self._info)
        self._last_ok = self._clock.monotonic()
        metrics.WORKER_HEARTBEATS.inc()  # registering writes the first heartbeat
        metrics.WORKER_LAST_HEARTBEAT.set_to_current_time()
        self._beating = asyncio.create_task(self._beat_forever(), name="yoke-heartbeat")
        await self.adopt()

    async def run(self) -> None:
        """Adopt whenever the set of workers changes (the beat runs since
        ``register``)."""
        await self._adopt_forever()

    async def leave(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
            self._beating = None
        await self._store().unregister_worker(self.worker_id)

    # --- the beat --------------------------------------------------------------

    async def _beat_forever(self) -> None:
        clock = self._clock
        due = clock.monotonic() + self._heartbeat_s
        while True:
            await asyncio.sleep(max(due - clock.monotonic(), 0))
            started = clock.monotonic()
            self._latest = max(self._latest, started - due)
            due = started + self._heartbeat_s
            try:
                # A beat that hangs (a database gone quiet) must not hold back
                # the next one forever; cancelling it is safe (store.postgres).
                async with asyncio.timeout(self._stale_s):
                    await self.beat()
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                self._failed += 1
                metrics.WORKER_HEARTBEAT_FAILURES.inc()
                # A timeout that fires late means the loop itself stalled (or
                # the process was stopped) while the beat was in flight.
                self._latest = max(self._latest, clock.monotonic() - started - self._stale_s)
                log.warning("worker heartbeat took longer than worker_stale_s (%ss)", self._stale_s)
            except Exception:
                self._failed += 1
                metrics.WORKER_HEARTBEAT_FAILURES.inc()
                log_retried(log, "worker heartbeat failed")

    async def beat(self) -> None:
        """Heartbeat; rejoin if this worker was reaped meanwhile; reap the
        workers silent for longer than ``worker_stale_s``."""
        actors = self._store()
        started = self._clock.monotonic()
        if not await actors.heartbeat(self.worker_id):
            # Taken for dead, and its instances go to others: rejoin as new,
            # dropping what it cached about them.
            reason, why = self._why_reaped(started)
            log.warning("worker %s was reaped (%s); rejoining", self.worker_id, why)
            metrics.WORKER_REJOINS.labels(reason).inc()
            self._on_evicted()
            await actors.register_worker(self.worker_id, self._info)
            self._adopt.set()
        self._last_ok, self._failed, self._latest = started, 0, 0.0
        metrics.WORKER_HEARTBEATS.inc()
        metrics.WORKER_LAST_HEARTBEAT.set_to_current_time()
        reaped = await actors.reap_workers(self.worker_id, int(self._stale_s * 1000))
        for gone in reaped:
            log.warning(
                "reaped worker %s (host %s, pid %s): no heartbeat for %.1fs by the database's clock"
                " (worker_stale_s %s); its instances go to the live workers",
                gone.worker_id, gone.info.get("host"), gone.info.get("pid"), gone.silent_ms / 1000, self._stale_s,
            )
            metrics.WORKER_REAPS.labels("stale").inc()
        if reaped:
            self._adopt.set()

    def _why_reaped(self, now: float) -> tuple[str, str]:
        """(metric reason, log text) for a reap of this worker noticed at ``now``."""
        silent = now - self._last_ok
        if silent <= self._stale_s:
            return "reaped_while_beating", (
                f"its last heartbeat went through {silent:.1f}s ago: another process reaps"
                " with a shorter worker_stale_s, or removed it"
            )
        # A stalled loop explains the failures it causes, so it is named first.
        if self._latest > self._heartbeat_s:
            return "loop_blocked", (
                f"no heartbeat for {silent:.1f}s: this process's event loop was blocked"
                f" (a beat ran {self._latest:.1f}s late), or the process was stopped"
            )
        if self._failed:
            return "heartbeat_failed", f"{self._failed} heartbeats failed over {silent:.1f}s"
        return "heartbeat_slow", f"no heartbeat for {silent:.1f}s: its heartbeats took that long"

    # --- adoption ----------------------------------------------------------------

    async def _adopt_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat_s):
                    await self._adopt.wait()
            self._adopt.clear()
            try:
                await self.adopt()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "adopting instances failed")

    async def adopt(self) -> None:
        """Share the instances, tenant by tenant: give up those beyond this
        worker's fair share (a worker joined), then take unowned ones (their
        owner left or was reaped, another gave them up, or none was ever
        given) up to it. The share is ceil(instances / live workers), so
        the workers settle within a pass or two of each other, and an
        instance moves only from a worker over its share."""
        actors = self._store()
        workers = len(await actors.live_workers())
        for tenant in await actors.tenants():
            released = await actors.release_excess(tenant, self.worker_id, workers, self._actors)
            if released:
                log.info("worker %s gave up %d instances of tenant %s to the %d live workers",
                         self.worker_id, len(released), tenant, workers)
                metrics.INSTANCES_RELEASED.inc(len(released))
                if self._on_released is not None:
                    self._on_released(tenant, released)
            if await actors.adopt_instances(tenant, self.worker_id, workers, self._actors):
                self._hub.wake(tenant, GLOBAL)  # their yoke.instance.adopted facts
                self._on_adopted(tenant)
