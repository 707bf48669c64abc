"""The scheduler: claim queue rows of the instances this worker owns and run
``process(ctx, event)`` for each.

Claims are one SQL statement per tenant (store ``claim``) that respects each
(instance, group)'s concurrency and reclaims expired leases. A run holds its
slot until ``process()`` returns (no early ack): success deletes the row
(in the round trip that claims the next rows); an exception or a timeout returns it to pending with
exponential backoff and jitter, or dead-letters it after ``max_attempts``.
The scheduler wakes on enqueues (in-process, and NOTIFY on PostgreSQL),
when a run finishes, and on a periodic sweep.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
import traceback
from collections import defaultdict
from typing import TYPE_CHECKING

from ..events import Event, now_ms
from ..store.actors import InstanceInfo, Policy, QueueRow
from .app import ActorDef, App
from .context import Context
from .ops import OpHandler

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger("yoke.actors.scheduler")

LEASE_GRACE_MS = 1000  # a lease outlives the actor's timeout by this much
LEASE_MARGIN_MS = 500  # a run is cancelled this long before its lease ends


class LeaseLost(Exception):
    """The row's lease ended before its run could start."""
MAX_ERROR_CHARS = 4096


def backoff_s(definition: ActorDef, attempt: int) -> float:
    base = min(definition.retry_base_s * 2 ** (attempt - 1), definition.retry_max_s)
    return base * random.uniform(0.8, 1.2)


def event_from_queue(row: QueueRow) -> Event:
    d = row.event
    return Event(
        offset=d.get("offset") or 0,
        id=d["id"],
        at=d["at"],
        type=d["type"],
        payload=d.get("payload"),
        metadata=d.get("metadata") or {},
        source=d.get("source"),
        correlation=d.get("correlation"),
        priority=d.get("priority") or 0,
        group_id=d.get("group_id"),
        idempotency_key=d.get("idempotency_key"),
        tenant=row.tenant,
        path=d.get("path"),  # type: ignore[arg-type]  # None for events sent directly
    )


class Scheduler:
    def __init__(self, runtime: Runtime, app: App, worker_id: str, *, max_in_flight: int, sweep_s: float) -> None:
        self._runtime = runtime
        self._app = app
        self._worker_id = worker_id
        self._max_in_flight = max_in_flight
        self._sweep_s = sweep_s
        self._policies = [
            Policy(d.name, d.concurrency, int(d.timeout_s * 1000) + LEASE_GRACE_MS)
            for d in app.actors.values()
        ]
        self._dirty: set[str] = set()
        self._all = True
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        # Finished rows waiting to be deleted, per tenant (with the next claim).
        self._done: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._instances: dict[tuple[str, str], InstanceInfo] = {}
        # Retries this worker scheduled, (due, tenant): claim again when due.
        self._retries: list[tuple[int, str]] = []
        self.stopping = False
        self.idle = asyncio.Event()  # set after a claim pass found nothing to do
        self.on_run = None  # test hook: (row, started, finished, ok) -> None

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def wake(self, tenant: str | None = None) -> None:
        if tenant is None:
            self._all = True
        else:
            self._dirty.add(tenant)
        self.idle.clear()
        self._wake.set()

    def forget_instances(self) -> None:
        self._instances.clear()

    # --- claiming --------------------------------------------------------------

    async def run(self) -> None:
        if not self._policies:
            return
        while not self.stopping:
            timeout = self._sweep_s
            if self._retries:
                timeout = min(timeout, max((self._retries[0][0] - now_ms()) / 1000, 0))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                if not self._retries or self._retries[0][0] > now_ms():
                    self._all = True  # the periodic sweep
            self._wake.clear()
            while self._retries and self._retries[0][0] <= now_ms():
                self._dirty.add(heapq.heappop(self._retries)[1])
            try:
                await self._claim_dirty()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claiming failed; retrying")
                self._all = True
                await asyncio.sleep(0.5)

    async def _claim_dirty(self) -> None:
        claimed = 0
        try:
            claimed = await self._claim_pass()
        finally:
            # Quiet: nothing claimed, nothing running, nothing left to do.
            if not claimed and not self._running and not self._dirty and not self._done:
                self.idle.set()

    async def _claim_pass(self) -> int:
        claimed = 0
        if self._all:
            self._all = False
            self._dirty.update(await self._runtime.store.actors.tenants())
        dirty, self._dirty = self._dirty | set(self._done), set()
        for tenant in dirty:
            while not self.stopping:
                # Finished rows are deleted by the same round trip that
                # claims the next ones.
                done = self._done.pop(tenant, [])
                free = max(self._max_in_flight - len(self._running), 0)
                if free == 0 and not done:
                    self._dirty.add(tenant)  # revisit when a run finishes
                    break
                rows = await self._runtime.store.actors.claim(
                    tenant, self._worker_id, self._policies, now_ms(), free, done
                )
                claimed += len(rows)
                await self._load_instances(tenant, rows)
                for row in rows:
                    task = asyncio.create_task(self._run_row(row), name=f"yoke-process-{row.qid}")
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
                if len(rows) < free or free == 0:
                    break
        return claimed

    # --- running -----------------------------------------------------------

    async def _load_instances(self, tenant: str, rows: list[QueueRow]) -> None:
        """Look up the instances of newly claimed rows in one query."""
        missing = {r.instance_id for r in rows if (tenant, r.instance_id) not in self._instances}
        if missing:
            for info in await self._runtime.store.actors.get_instances(tenant, sorted(missing)):
                self._instances[(tenant, info.instance_id)] = info

    async def _instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        key = (tenant, instance_id)
        info = self._instances.get(key)
        if info is None:
            info = await self._runtime.store.actors.get_instance(tenant, instance_id)
            if info is not None:
                self._instances[key] = info
        return info

    async def _run_row(self, row: QueueRow) -> None:
        definition = self._app.actors[row.actor]
        started = time.time()
        ok = False
        error = tb = ""
        # The run must end before its lease does (another worker may claim
        # the row then): its time is the actor's timeout, cut short when the
        # run starts late, and a row whose lease is nearly over does not start.
        budget_s = min(definition.timeout_s, (row.lease_until - LEASE_MARGIN_MS - now_ms()) / 1000)
        try:
            if budget_s <= 0:
                raise LeaseLost("claimed, but its lease ran out before process() could start")
            async with asyncio.timeout(budget_s):
                instance = await self._instance(row.tenant, row.instance_id)
                if instance is None:
                    raise LookupError(f"instance {row.instance_id} does not exist")
                ops = OpHandler(self._runtime, row.tenant, instance)
                ctx = Context(ops, instance, event_from_queue(row), row.attempts)
                await definition.handler(ctx, ctx.event)
            ok = True
        except TimeoutError:
            error = f"process() timed out after {budget_s:.3g}s"
            tb = traceback.format_exc()
        except asyncio.CancelledError:
            error, tb = "worker shut down during process()", ""
            await self._settle(row, definition, False, error, tb, cancelled=True)
            raise
        except Exception as exc:  # the actor's failure, recorded on the row
            error = f"{type(exc).__name__}: {exc}"
            tb = traceback.format_exc()
        finished = time.time()
        if self.on_run is not None:
            self.on_run(row, started, finished, ok)
        self._runtime.metrics_processed(row, definition, ok, finished - started)
        await self._settle(row, definition, ok, error, tb)

    async def _settle(
        self, row: QueueRow, definition: ActorDef, ok: bool, error: str, tb: str, *,
        cancelled: bool = False,
    ) -> None:
        if ok:
            self._done[row.tenant].append((row.qid, row.attempts))
            self.idle.clear()
            self._wake.set()
            return
        if cancelled:
            retry_at: int | None = now_ms()
        elif row.attempts >= definition.max_attempts:
            retry_at = None
            log.warning("dead-lettered %s row %s after %s attempts: %s",
                        row.instance_id, row.qid, row.attempts, error)
        else:
            retry_at = now_ms() + int(backoff_s(definition, row.attempts) * 1000)
            heapq.heappush(self._retries, (retry_at, row.tenant))
        try:
            await self._runtime.store.actors.fail(
                row.tenant, row.qid, row.attempts, retry_at=retry_at,
                error=error[:MAX_ERROR_CHARS], traceback=tb[-MAX_ERROR_CHARS * 4 :],
            )
        except Exception:
            log.exception("could not record the failure of row %s; its lease will expire", row.qid)
        self.wake(row.tenant)

    async def flush_completions(self) -> None:
        done, self._done = self._done, defaultdict(list)
        for tenant, rows in done.items():
            await self._runtime.store.actors.complete(tenant, rows)

    async def stop(self, timeout_s: float) -> None:
        """Stop claiming; let runs finish for ``timeout_s``, then cancel them
        (their rows go back to pending)."""
        self.stopping = True
        self._wake.set()
        if self._running:
            _, pending = await asyncio.wait(set(self._running), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.flush_completions()
