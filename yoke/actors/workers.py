"""Worker membership: many processes sharing one database.

Each executor registers in ``runtime_workers`` and heartbeats. A worker owns
the instances it creates and adopts unowned ones up to a fair share; a
worker whose heartbeat is older than ``worker_stale_s`` is reaped and its
instances become unowned, so live workers adopt them. Rows the dead worker
was processing come back when their leases expire (a lease outlives the
actor's timeout), so a worker that only looked dead cannot run a row at the
same time as its successor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..events import now_ms
from ..lifecycle import GLOBAL
from ..store.faults import log_retried

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger("yoke.actors.workers")


class Membership:
    def __init__(
        self, runtime: Runtime, worker_id: str, *, heartbeat_s: float, stale_s: float,
        on_adopted: Callable[[str], None], on_evicted: Callable[[], None],
        actors: list[str],
    ) -> None:
        self._runtime = runtime
        self.worker_id = worker_id
        self._heartbeat_s = heartbeat_s
        self._stale_ms = int(stale_s * 1000)
        self._on_adopted = on_adopted
        self._on_evicted = on_evicted
        self._actors = actors  # adopt only instances this worker can run

    async def register(self) -> None:
        await self._runtime.store.actors.register_worker(
            self.worker_id, now_ms(), {"host": socket.gethostname(), "pid": os.getpid()}
        )
        await self.tick()

    async def tick(self) -> None:
        actors = self._runtime.store.actors
        if not await actors.heartbeat(self.worker_id, now_ms()):
            # We were taken for dead and our instances went to others:
            # rejoin as new, dropping what we cached about them.
            log.warning("worker %s was reaped; rejoining", self.worker_id)
            self._on_evicted()
            await actors.register_worker(
                self.worker_id, now_ms(), {"host": socket.gethostname(), "pid": os.getpid()}
            )
        gone = await actors.reap_workers(now_ms() - self._stale_ms)
        tenants = await actors.tenants()
        if gone:
            log.warning("reaped stale workers %s", ", ".join(gone))
            for tenant in tenants:
                await actors.release_instances(tenant, gone)
        workers = len(await actors.live_workers())
        for tenant in tenants:
            if await actors.adopt_instances(tenant, self.worker_id, workers, self._actors):
                self._runtime.hub.wake(tenant, GLOBAL)  # their yoke.instance.adopted facts
                self._on_adopted(tenant)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "worker heartbeat failed")

    async def leave(self) -> None:
        await self._runtime.store.actors.unregister_worker(self.worker_id)
