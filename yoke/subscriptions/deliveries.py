"""The delivery engine of one process: holds subscriptions and runs one
``Runner`` per subscription it holds.

The process registers as a delivering process (``delivery_owners``) and
heartbeats four times per ``subscription_lease_s``, on a task (and, on
PostgreSQL, a connection) of its own. While its heartbeat lives it holds the
subscriptions leased to it: one statement renews them all. Which process
holds which subscription is ``leases.plan``'s answer (each process about its
share; when processes come and go, only the subscriptions that must move
move). A sweep goes tenant by tenant, taking and giving up leases and
starting or stopping runners: at start, when processes come or go, when
another process announces a change in a tenant (PostgreSQL: NOTIFY
yoke_subscription), after a change made here, and every
``subscription_sweep_s`` as the safety net, which also wakes the runner of a
subscription whose source is ahead of its cursor. Between appends an idle
runner waits for its source's wake-up and costs no round trip (SQLite,
where other processes' commits announce nothing: one PRAGMA a second tells
whether one committed, ``_watch_others``). A clean
shutdown removes the process's row: its subscriptions are free at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ..clock import SYSTEM, Clock, wall_ms
from ..config import Settings
from ..routing.evaluation import Evaluations
from ..signals import Signals
from ..tracing import Tracing
from ..store import OpenStore
from ..store.faults import log_retried
from ..store.subscriptions import Change, Decide, DeliveryOwner, Probe, SourceState, SubscriptionRow
from ..streams.append import AppendService, new_stream_id, refusal_error
from ..streams.wakeups import WakeupHub
from .copies import Copying, OpenStream
from .runner import Runner
from .leases import plan

log = logging.getLogger("yoke.subscriptions")

Key = tuple[str, str, str]  # (tenant, source path, name)
BEATS_PER_LEASE = 4
RESTART_S = 1.0  # a runner that crashed (the store, or a bug) is started again after this
OTHERS_SWEEP_S = 5.0  # SQLite: the most often other processes' writes make every tenant swept


@dataclass(frozen=True)
class DeliverySettings:
    """The settings values the deliveries use."""

    sweep_s: float
    lease_s: float
    tail_sweep_s: float
    timeout_s: float  # one receiver call
    retry_base_s: float
    retry_max_s: float

    @classmethod
    def of(cls, settings: Settings) -> DeliverySettings:
        return cls(
            sweep_s=settings.subscription_sweep_s, lease_s=settings.subscription_lease_s,
            tail_sweep_s=settings.tail_sweep_s, timeout_s=settings.subscription_timeout_s,
            retry_base_s=settings.subscription_retry_base_s, retry_max_s=settings.subscription_retry_max_s,
        )


class Deliveries:
    """``receivers`` and ``processors``: the application's, by name;
    ``deploy_version``: the application's (halted subscriptions resume once
    under another), ``code_version`` the code's hash under --reload;
    ``application``: what a processor's ``after`` gets as ``ctx.runtime``
    (the public runtime object, opaque here)."""

    def __init__(
        self,
        store: OpenStore,
        hub: WakeupHub,
        appends: AppendService,
        evaluations: Evaluations,
        signals: Signals,
        open_stream: OpenStream,
        *,
        settings: DeliverySettings,
        max_event_bytes: int,
        receivers: Mapping[str, Callable[[dict[str, Any]], Awaitable[Any]]] | None = None,
        processors: Mapping[str, Any] | None = None,
        deploy_version: str = "",
        code_version: str | None = None,
        application: Any = None,
        clock: Clock = SYSTEM,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.tracing = tracing or Tracing()  # a span per delivery attempt, when on
        self.hub = hub
        self.appends = appends
        self.evaluations = evaluations
        self.signals = signals
        self.open_stream = open_stream
        self.settings = settings
        self.application = application
        self.clock = clock
        self.copying = Copying(store, appends, open_stream, max_event_bytes, clock)
        self.owner = "dlv_" + secrets.token_hex(8)
        # Halted subscriptions resume once under a different version. Under
        # --reload the code's hash is part of it (redeployed() on a change).
        self.base_version = deploy_version
        self.version = self._versioned(code_version)
        self.receivers: Mapping[str, Callable[[dict[str, Any]], Awaitable[Any]]] = receivers or {}
        self.processors: Mapping[str, Any] = processors or {}
        self._functions = tuple(self.receivers)
        self._processors = tuple(self.processors)
        self.sweep_s = settings.sweep_s
        self.lease_s = settings.lease_s
        self._http: httpx.AsyncClient | None = None  # made on the first webhook
        self._runners: dict[Key, tuple[Runner, asyncio.Task[None]]] = {}
        # What the next sweep visits: every tenant, or these tenants (the
        # source paths named, or None: all of the tenant's).
        self._everything = True
        self._wanted: dict[str, set[str] | None] = {}
        self._wake = asyncio.Event()
        self._holding_until = 0.0  # monotonic: this process's lease, as its last heartbeat renewed it
        self._joined_as = ""  # the version registered
        self._tasks: list[asyncio.Task[None]] = []
        self._retiring: set[asyncio.Task[None]] = set()  # runners of a source's old lifetime
        self._disconnect: list[Callable[[], None]] = []

    def _versioned(self, code_version: str | None) -> str:
        version = self.base_version
        if code_version:
            version = f"{version}+{code_version}" if version else code_version
        return version.replace("|", "/")

    def _me(self) -> DeliveryOwner:
        return DeliveryOwner(self.owner, self.version, self._functions, self._processors,
                             socket.gethostname(), os.getpid())

    def redeployed(self, code_version: str) -> None:
        """The application's code changed (--reload): a new deploy version,
        so the next sweep takes the subscriptions halted under the old one
        and their runners resume them."""
        self.version = self._versioned(code_version)
        self.look_again()  # the heartbeat records the new version first

    @property
    def holding(self) -> bool:
        """Whether this process's lease still runs: another process takes
        its subscriptions only after a lease of silence, by then this one
        has stopped delivering them."""
        return self.clock.monotonic() < self._holding_until

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        await self._join()
        self.hub.resync_observers.append(self.look_again)
        self._disconnect = [
            self.signals.subscription_changed.connect(self.changed),
            self.signals.subscription_announced.connect(self.announced),
            self.signals.stream_deleted.connect(self.stream_deleted),
            self.signals.code_changed.connect(self.redeployed),
        ]
        self._tasks = [
            asyncio.create_task(self._sweep_forever(), name="yoke-deliveries"),
            asyncio.create_task(self._beat_forever(), name="yoke-deliveries-heartbeat"),
            asyncio.create_task(self._watch_others(), name="yoke-deliveries-others"),
        ]

    async def stop(self) -> None:
        for disconnect in self._disconnect:
            disconnect()
        self._disconnect = []
        with contextlib.suppress(ValueError):
            self.hub.resync_observers.remove(self.look_again)
        tasks = [*self._tasks, *(t for _, t in self._runners.values()), *self._retiring]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runners.clear()
        try:
            await self.store().subscriptions.drop_owner(self.owner)
        except Exception:
            log.exception("could not give up the subscriptions' leases")
        if self._http is not None:
            await self._http.aclose()

    def announced(self, payload: str) -> None:
        """Another process announced a change: 'tenant|path' (subscriptions
        of that source), 'tenant' (any of the tenant's), or '' (processes
        came or went)."""
        tenant, _, path = payload.partition("|")
        self.want(tenant or None, path or None)

    def want(self, tenant: str | None, path: str | None = None) -> None:
        """Sweep soon: the subscriptions of ``path`` in ``tenant`` (None:
        every path of the tenant; every tenant)."""
        if tenant is None:
            self._everything = True
        elif path is None:
            self._wanted[tenant] = None
        else:
            paths = self._wanted.setdefault(tenant, set())
            if paths is not None:
                paths.add(path)
        self._wake.set()

    def look_again(self) -> None:
        """Sweep every tenant now (announcements may have been missed)."""
        self.want(None)

    # --- the heartbeat -----------------------------------------------------------

    async def _join(self) -> None:
        """Register (or again: taken for gone, or a new deploy version to record)."""
        started = self.clock.monotonic()
        me = self._me()
        await self.store().subscriptions.register_owner(me, int(self.lease_s * 1000))
        self._holding_until = started + self.lease_s
        self._joined_as = me.version
        self.look_again()

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / BEATS_PER_LEASE)
            try:
                async with asyncio.timeout(self.lease_s):  # cancelling is safe (store.postgres)
                    await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "delivery heartbeat failed")

    async def beat(self) -> None:
        """Renew this process's lease (every subscription it holds); rejoin
        if it was taken for gone meanwhile; remove the processes silent for
        longer than their lease."""
        store = self.store().subscriptions
        started = self.clock.monotonic()
        lapsed = not self.holding
        if not await store.beat_owner(self.owner):
            log.warning("delivery process %s was taken for gone (no heartbeat for a lease); its"
                        " subscriptions went free: rejoining", self.owner)
            self._stop_runners(lambda key: True)
            await self._join()
            return
        if self._joined_as != self.version:  # redeployed: what it can resume changed
            await self._join()
        self._holding_until = started + self.lease_s
        if lapsed:
            self.look_again()  # runners stopped while the lease had run out
        for gone in await store.reap_owners(self.owner):
            log.warning("delivery process %s (host %s, pid %s) went silent for a lease: its"
                        " subscriptions go to the live processes", gone.owner, gone.host, gone.pid)
            self.look_again()

    async def _watch_others(self) -> None:
        """Where other processes' commits announce nothing (SQLite): look,
        every ``tail_sweep_s``, whether one committed; if so, the runners
        read again (a source appended to elsewhere) and, at most every
        ``OTHERS_SWEEP_S``, every tenant is swept (a subscription configured
        or freed elsewhere). Idle, with no other process writing, this costs
        one PRAGMA a second."""
        last_sweep = self.clock.monotonic()
        while True:
            await asyncio.sleep(self.settings.tail_sweep_s)
            try:
                if not await self.store().others_committed():
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "looking for other processes' commits failed")
                continue
            for runner, _ in self._runners.values():
                runner.poke()
            if self.clock.monotonic() - last_sweep >= OTHERS_SWEEP_S:
                last_sweep = self.clock.monotonic()
                self.look_again()

    # --- sweeps ---------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            wanted = None if self._everything else self._wanted
            self._everything, self._wanted = False, {}
            self._wake.clear()
            try:
                await self.sweep(wanted)
            except Exception:
                # Whatever it did not get to, the next one does.
                if wanted is None:
                    self.look_again()
                for tenant, paths in wanted.items() if wanted is not None else ():
                    for path in paths or [None]:
                        self.want(tenant, path)
                log_retried(log, "subscription sweep failed")
            woken = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_s):
                    woken = await self._wake.wait()
            if not woken:
                self._everything = True  # the periodic safety net

    async def sweep(self, wanted: Mapping[str, Collection[str] | None] | None = None) -> None:
        """Take and give up leases and start or stop runners: of the tenants
        in ``wanted`` (of the source paths given, or all of the tenant's),
        or (None) of every tenant with subscriptions."""
        store = self.store().subscriptions
        if not self.holding:
            return  # the heartbeat rejoins first
        owners = await store.owners()
        if not any(o.owner == self.owner for o in owners):
            return  # taken for gone: the heartbeat rejoins, then sweeps
        if wanted is None:
            wanted = dict.fromkeys(await store.tenants())
            self._stop_runners(lambda key: key[0] not in wanted)  # tenants with no subscription left
        for tenant, paths in sorted(wanted.items()):
            await self._sweep_tenant(tenant, owners, None if paths is None else sorted(paths))

    async def _sweep_tenant(self, tenant: str, owners: list[DeliveryOwner], paths: list[str] | None) -> None:
        store = self.store().subscriptions
        decided = plan(await store.leases(tenant, paths), owners, self.owner)
        give = []
        for path, name in decided.give:
            entry = self._runners.get((tenant, path, name))
            if entry is None or entry[1].done():
                give.append((path, name))
            else:
                entry[0].leave()  # given up when its runner ends, between two steps
        if give:
            await store.give(tenant, self.owner, give)
        held = list(decided.keep)
        if decided.take:
            held.extend(await store.take(tenant, self.owner, decided.take))
        keys: set[Key] = set()
        for row in held:
            key = (tenant, row.path, row.name)
            keys.add(key)
            entry = self._runners.get(key)
            if entry is not None and entry[0].row.source_stream_id != row.source_stream_id:
                # The name belongs to a new lifetime of the source: the old
                # one's runner ends by itself (its acknowledgements land
                # nowhere), perhaps after a delivery still in flight.
                self._retiring.add(entry[1])
                entry[1].add_done_callback(self._retiring.discard)
                entry = None
            if entry is None or entry[1].done():
                runner = Runner(self, row)
                task = asyncio.create_task(self._guard(runner), name=f"yoke-sub:{row.path}:{row.name}")
                self._runners[key] = (runner, task)
            else:
                entry[0].update(row)
        self._stop_runners(
            lambda key: key[0] == tenant and (paths is None or key[1] in paths) and key not in keys, leaving=False
        )

    def _stop_runners(self, which: Callable[[Key], bool], *, leaving: bool = True) -> None:
        """Cancel the runners ``which`` picks (``leaving=False``: not those
        on their way to another process)."""
        for key, (runner, task) in list(self._runners.items()):
            if which(key) and (leaving or not runner.leaving):
                task.cancel()
                del self._runners[key]

    async def _guard(self, runner: Runner) -> None:
        try:
            await runner.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not a receiver failure (the runner handles those): the store or
            # a bug. It still counts on the retry ladder, so it is visible,
            # backs off and halts in the end; it starts again shortly.
            r = runner.row
            log.exception("delivery of %s %s stopped; starting it again", r.path, r.name)
            with contextlib.suppress(Exception):
                await runner.crashed(exc)
            asyncio.get_running_loop().call_later(RESTART_S, self.want, r.tenant, r.path)
            return
        if runner.leaving:
            r = runner.row
            key = (r.tenant, r.path, r.name)
            if self._runners.get(key, (None,))[0] is runner:
                del self._runners[key]
            try:
                await self.store().subscriptions.give(r.tenant, self.owner, [(r.path, r.name)])
            except Exception:  # the next sweep gives it up
                log_retried(log, "giving up the lease of %s %s failed", r.path, r.name)

    # --- used by runners and by the operator methods ---------------------------------

    @property
    def http(self) -> httpx.AsyncClient:
        """The webhook client, created when first needed (not at start-up:
        most runtimes never post a webhook)."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.settings.timeout_s)
        return self._http

    def changed(self, tenant: str, path: str, name: str) -> None:
        """A change made here: the runner rereads its row; the tenant is
        swept now (a new subscription gets its runner)."""
        entry = self._runners.get((tenant, path, name))
        if entry is not None:
            entry[0].dirty = True
            entry[0].poke()
        self.want(tenant, path)

    async def stream_deleted(self, tenant: str, path: str) -> None:
        """Stop the runners of a deleted stream's subscriptions now (their
        rows are gone; runners elsewhere stop at their next read, which sees
        another lifetime or none)."""
        self._stop_runners(lambda key: key[:2] == (tenant, path))
        self.want(tenant, path)

    def held(self) -> list[Runner]:
        """The runners of the subscriptions this process holds (for /metrics)."""
        return [runner for runner, _ in self._runners.values()]

    def progressed(self) -> None:
        """A cursor advanced here: whoever waits for one looks again."""
        self.signals.subscription_progressed.emit()

    def receiver(self, name: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        function = self.receivers.get(name)
        if function is None:
            raise LookupError(f"no receiver function named {name!r} is registered in the application")
        return function

    async def control(self, row: SubscriptionRow, decide: Decide) -> Any:
        """A runner's decision about ``row``; None (nothing written, not even
        the source stream created again) when the subscription is gone or its
        name now belongs to another lifetime of the source."""

        def same_lifetime(current: SubscriptionRow | None, source: SourceState) -> Change:
            if current is None or current.source_stream_id != row.source_stream_id:
                raise _Gone
            return decide(current, source)

        try:
            return await control(
                self.store, self.appends, row.tenant, row.path, row.name, same_lifetime, now=wall_ms(self.clock)
            )
        except _Gone:
            return None


class _Gone(Exception):
    """A runner's subscription no longer exists in its source lifetime."""


async def control(
    store: OpenStore, appends: AppendService, tenant: str, path: str, name: str, decide: Decide, *,
    now: int, copies_into: str | None = None, probe: Probe | None = None,
) -> Any:
    """Run a control decision at ``now`` (the caller's clock); raise if the
    stream refused its events; wake readers of the source. Returns the
    decision's reply (None: no change). ``copies_into``, ``probe``: see
    ``SubscriptionStore.control``."""
    change, outcomes = await store().subscriptions.control(
        tenant, path, name, decide, now, new_stream_id(), copies_into=copies_into, probe=probe
    )
    refused = next((o for o in outcomes if o.status not in ("ok", "duplicate")), None)
    if refused is not None:
        raise refusal_error(refused.status, path, [])
    if change.events:
        appends.appended(tenant, path, len(change.events))
    return change.reply
