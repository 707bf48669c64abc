"""Fan-out: route appended events into actor queues.

After an append commits, the stream is marked dirty (in-process appends, and
on PostgreSQL the NOTIFY of other processes). The fan-out task reads the
stream after its persisted cursor, matches each event through the routing
index, and in one transaction enqueues the matches and moves the cursor,
provided nobody moved it first and the routing version is the one the index
was built from. So an event is enqueued at most once per instance, and at
least once: on start, after a lost notification, and on a periodic sweep
(which also finds appends by other processes on SQLite, which cannot
notify), fan-out catches up from the cursors. Appends never wait for any of this.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson

from ..clock import SYSTEM, Clock, wall_ms
from ..lifecycle import GLOBAL
from ..routing.filters import Filter
from ..routing.index import Route, RoutingIndex
from ..store.actors import QueueItem
from ..store.faults import log_retried
from .app import App

if TYPE_CHECKING:
    from ..routing.evaluation import Evaluations
    from ..store.actors import ActorStore
    from ..store.contract import ReadPage
    from ..streams.wakeups import WakeupHub

log = logging.getLogger("yoke.actors.fanout")

PAGE = 1000  # events per fan-out transaction
MAX_CURSORS = 100_000  # streams whose fan-out cursor is cached


class Fanout:
    """``store()``: the actor store (cursors, routing, queues); ``read``: a
    page of a stream's events; ``hub``: tails of ``/`` hear of keyed
    instances made; ``evaluations``: where JSONata filters run."""

    def __init__(
        self, app: App, worker_id: str, on_enqueued: Callable[[str], None], *,
        store: Callable[[], ActorStore], read: Callable[[str, str, int, int], Awaitable[ReadPage]],
        hub: WakeupHub, evaluations: Evaluations, sweep_s: float, clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._read = read
        self._hub = hub
        self._evaluations = evaluations
        self._clock = clock
        self._sweep_s = sweep_s
        self._app = app
        self._worker_id = worker_id
        self._on_enqueued = on_enqueued  # (tenant) -> None: wake the scheduler
        self._dirty: dict[str, set[str]] = defaultdict(set)
        self._everything = True  # catch up every stream of every tenant
        self._wake = asyncio.Event()
        self._wake.set()
        self._indexes: dict[str, tuple[int, RoutingIndex]] = {}
        self._app_routes = [
            Route(filter=d.filter, actor=d.name)
            for d in app.actors.values()
            if d.keyed and d.filter is not None
        ]
        # Fan-out cursors as this process last left them, by stream: a cache
        # (a miss reads the cursor row), keyed by client-chosen paths, so
        # bounded; the oldest remembered go first.
        self._cursors: dict[tuple[str, str], int] = {}
        self.max_cursors = MAX_CURSORS
        self.idle = asyncio.Event()  # set while nothing is known to be pending

    # --- triggers ------------------------------------------------------------

    def appended(self, tenant: str, path: str) -> None:
        self._dirty[tenant].add(path)
        self.idle.clear()
        self._wake.set()

    def resync(self) -> None:
        """Notifications may have been missed: catch up everything."""
        self._everything = True
        self.idle.clear()
        self._wake.set()

    def routing_changed(self, tenant: str) -> None:
        self._indexes.pop(tenant, None)

    def forget(self, tenant: str, path: str) -> None:
        """The stream was deleted: its cached cursor belonged to the old one."""
        self._cursors.pop((tenant, path), None)

    def _remember(self, tenant: str, path: str, through: int) -> None:
        cursors = self._cursors
        if (tenant, path) not in cursors and len(cursors) >= self.max_cursors:
            del cursors[next(iter(cursors))]
        cursors[(tenant, path)] = through

    # --- the loop ------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can
                # swallow a cancellation that races the wake-up, and then the
                # loop never stops (close() hung on it).
                async with asyncio.timeout(self._sweep_s):
                    await self._wake.wait()
            except TimeoutError:
                # The safety net: appends by processes that cannot notify us
                # (SQLite), or notifications lost, are found from the cursors.
                self._everything = True
            self._wake.clear()
            try:
                if self._everything:
                    self._everything = False
                    actors = self._store()
                    for tenant in await actors.tenants():
                        for lag in await actors.fanout_lag(tenant):
                            self._dirty[tenant].add(lag.path)
                dirty, self._dirty = self._dirty, defaultdict(set)
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "fan-out could not list the streams to route; retrying")
                self._everything = True
                await asyncio.sleep(0.5)
                self._wake.set()
                continue
            failed = False
            for tenant, paths in dirty.items():
                for path in sorted(paths):
                    try:
                        await self._fan_stream(tenant, path)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        # One stream's failure must not hold back the others:
                        # it is retried (from its cursor) after a pause.
                        log_retried(log, "fan-out of %s %s failed; retrying", tenant, path)
                        self._cursors.pop((tenant, path), None)
                        self._dirty[tenant].add(path)
                        failed = True
            if failed:
                await asyncio.sleep(0.5)
                self._wake.set()
                continue
            if not self._dirty and not self._everything:
                self.idle.set()

    async def _index(self, tenant: str) -> tuple[int, RoutingIndex]:
        cached = self._indexes.get(tenant)
        if cached is None:
            version, instances = await self._store().routing(tenant)
            keyed = {d.name for d in self._app.actors.values() if d.keyed}
            routes = [
                Route(filter=Filter.from_dict(i.filter), instance_id=i.instance_id)
                for i in instances
                # A keyed actor's instances get their events by key only
                # (one made with a filter elsewhere would get them twice).
                if i.filter is not None and i.actor not in keyed
            ]
            cached = self._indexes[tenant] = (version, RoutingIndex(routes + self._app_routes))
        return cached

    async def _fan_stream(self, tenant: str, path: str) -> None:
        actors = self._store()
        # The cursor as this process last left it; a stale one is corrected
        # by the commit ('moved').
        through = self._cursors.get((tenant, path))
        if through is None:
            through = await actors.fanout_cursor(tenant, path)
            if through is None:
                return
        while True:
            page = await self._read(tenant, path, through, PAGE)
            if page.head < through:
                # A head never goes back: the stream was deleted and created
                # again since this cursor was cached (in another process).
                self._cursors.pop((tenant, path), None)
                moved = await actors.fanout_cursor(tenant, path)
                if moved is None or moved == through:
                    return
                through = moved
                continue
            if not page.events and page.head <= through:
                self._remember(tenant, path, through)
                return
            full = len(page.events) == PAGE
            new_through = page.events[-1].offset if full else page.head
            version, index = await self._index(tenant)
            items = []
            documents = [event.to_dict() for event in page.events] if index.size else []
            routed = await index.targets(tenant, documents, self._evaluations)
            for event, document, targets in zip(page.events, documents, routed):
                if not targets:
                    continue
                event_json = orjson.dumps(document).decode()
                for t in targets:
                    items.append(
                        QueueItem(
                            event_json=event_json, group_id=event.group_id, priority=event.priority,
                            path=path, offset=event.offset, instance_id=t.instance_id,
                            actor=t.actor, key=t.key,
                        )
                    )
            status = await actors.fanout_commit(
                tenant, path, through, new_through, version, items, self._worker_id,
                wall_ms(self._clock),
            )
            if status == "stale":
                self._indexes.pop(tenant, None)
                continue
            if status == "moved":
                moved = await actors.fanout_cursor(tenant, path)
                if moved is None:
                    return
                through = moved
                continue
            through = new_through
            self._remember(tenant, path, through)
            if items:
                self._on_enqueued(tenant)
                if any(item.instance_id is None for item in items):  # keyed instances may be new:
                    self._hub.wake(tenant, GLOBAL)  # their yoke.instance.created facts
            if not full:
                # Caught up with the head this read saw; a later append
                # marks the stream dirty again.
                return
