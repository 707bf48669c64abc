"""The delivery engine of one process: leases subscriptions and runs one
``Runner`` per subscription it holds.

Every ``subscription_sweep_s`` (and at once after a local configuration
change) it claims every free subscription across tenants and renews the
leases it holds; a subscription whose lease another process holds is left to
that process, and taken over, from its cursor, once that lease expires. A
clean shutdown releases the leases so another process takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx

from ..events import now_ms
from ..store.faults import log_retried
from ..store.subscriptions import Change, Decide, Deliverable, Probe, SourceState, SubscriptionRow
from ..streams.append import new_stream_id, refusal_error
from .delivery import Runner

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger("yoke.subscriptions")

Key = tuple[str, str, str]  # (tenant, source path, name)


class Deliveries:
    def __init__(self, runtime: Runtime) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.owner = "dlv_" + secrets.token_hex(8)
        app_version = runtime.app.version if runtime.app is not None else None
        # Halted subscriptions resume once under a different version. Under
        # --reload the code's hash is part of it (redeployed() on a change).
        self.base_version = settings.deploy_version or app_version or ""
        self.version = self._versioned(runtime.code.version if runtime.code is not None else None)
        app = runtime.app
        self.deliverable = Deliverable(
            tuple(app.receivers) if app else (), tuple(app.processors) if app else ()
        )
        self.sweep_s = settings.subscription_sweep_s
        self.lease_ms = int(settings.subscription_lease_s * 1000)
        self._http: httpx.AsyncClient | None = None  # made on the first webhook
        self._runners: dict[Key, tuple[Runner, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._progress: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None

    def _versioned(self, code_version: str | None) -> str:
        version = self.base_version
        if code_version:
            version = f"{version}+{code_version}" if version else code_version
        return version.replace("|", "/")

    def redeployed(self, code_version: str) -> None:
        """The application's code changed (--reload): a new deploy version,
        so the next sweep claims the subscriptions halted under the old one
        and their runners resume them."""
        self.version = self._versioned(code_version)
        self._wake.set()

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="yoke-deliveries")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *(t for _, t in self._runners.values())) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runners.clear()
        try:
            await self.runtime.store.subscriptions.release(self.owner)
        except Exception:
            log.exception("could not release subscription leases")
        if self._http is not None:
            await self._http.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self._sweep()
            except Exception:
                log_retried(log, "subscription sweep failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_s):
                    await self._wake.wait()
            self._wake.clear()

    async def _sweep(self) -> None:
        rows = await self.runtime.store.subscriptions.claim(
            self.owner, self.version, now_ms(), self.lease_ms, self.deliverable
        )
        held: set[Key] = set()
        for row in rows:
            key = (row.tenant, row.path, row.name)
            held.add(key)
            entry = self._runners.get(key)
            if entry is None or entry[1].done():
                runner = Runner(self, row)
                task = asyncio.create_task(self._guard(runner), name=f"yoke-sub:{row.path}:{row.name}")
                self._runners[key] = (runner, task)
            else:
                entry[0].update(row)
        for key, (_, task) in list(self._runners.items()):
            if key not in held or task.done():
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
            # backs off and halts in the end; the next sweep restarts it.
            r = runner.row
            log.exception("delivery of %s %s stopped; the next sweep restarts it", r.path, r.name)
            with contextlib.suppress(Exception):
                await runner.crashed(exc)

    # --- used by runners and by the operator methods ---------------------------------

    @property
    def http(self) -> httpx.AsyncClient:
        """The webhook client, created when first needed (not at start-up:
        most runtimes never post a webhook)."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.runtime.settings.subscription_timeout_s)
        return self._http

    def changed(self, tenant: str, path: str, name: str) -> None:
        """A local operator change: the runner rereads its row; the sweep
        claims new subscriptions now."""
        entry = self._runners.get((tenant, path, name))
        if entry is not None:
            entry[0].dirty = True
            entry[0].poke()
        self._wake.set()

    def stream_deleted(self, tenant: str, path: str) -> None:
        """Stop the runners of a deleted stream's subscriptions now (their
        rows are gone; runners elsewhere stop at their next read, which sees
        another lifetime or none)."""
        for key, (_, task) in list(self._runners.items()):
            if key[:2] == (tenant, path):
                task.cancel()
                del self._runners[key]
        self._wake.set()

    def progressed(self) -> None:
        for event in self._progress:
            event.set()

    def watch(self) -> asyncio.Event:
        """An event set after every local cursor advance (``unwatch`` when done)."""
        event = asyncio.Event()
        self._progress.add(event)
        return event

    def unwatch(self, event: asyncio.Event) -> None:
        self._progress.discard(event)

    def receiver(self, name: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        app = self.runtime.app
        function = None if app is None else app.receivers.get(name)
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
            return await control(self.runtime, row.tenant, row.path, row.name, same_lifetime)
        except _Gone:
            return None


class _Gone(Exception):
    """A runner's subscription no longer exists in its source lifetime."""


async def control(
    runtime: Runtime, tenant: str, path: str, name: str, decide: Decide, *, copies_into: str | None = None,
    probe: Probe | None = None,
) -> Any:
    """Run a control decision; raise if the stream refused its events; wake
    readers of the source. Returns the decision's reply (None: no change).
    ``copies_into``, ``probe``: see ``SubscriptionStore.control``."""
    change, outcomes = await runtime.store.subscriptions.control(
        tenant, path, name, decide, now_ms(), new_stream_id(), copies_into=copies_into, probe=probe
    )
    refused = next((o for o in outcomes if o.status not in ("ok", "duplicate")), None)
    if refused is not None:
        raise refusal_error(refused.status, path, [])
    if change.events:
        runtime.appends.appended(tenant, path, len(change.events))
    return change.reply
