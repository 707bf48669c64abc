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
import traceback
from collections import defaultdict
from typing import TYPE_CHECKING

from .. import metrics
from ..clock import backoff_s
from ..events import Event
from ..store.actors import InstanceInfo, Policy, QueueRow
from ..store.inputs import Completion
from ..store.faults import log_retried
from ..hosts.pool import HandlerFailed, HostFailure, HostPool, RunOutput
from .app import ActorDef, App, code_of
from .atomic import AtomicRun
from .context import Context
from .journal import Journal
from .tape import Tape
from .ops import OpHandler
from ..tracing import carrier_of, end, in_run

if TYPE_CHECKING:
    from .kernel import ActorKernel

log = logging.getLogger("yoke.actors.scheduler")

LEASE_GRACE_MS = 1000  # a lease outlives the actor's timeout by this much
LEASE_MARGIN_MS = 500  # a run is cancelled this long before its lease ends
# An isolated run may wait this long for a free host (a replacement
# starting) without eating into its own time: its lease is longer by it.
HOST_WAIT_MS = 10_000


class LeaseLost(Exception):
    """The row's lease ended before its run could start."""
MAX_ERROR_CHARS = 4096
MAX_INSTANCES = 100_000  # instances whose row is cached


def event_from_queue(row: QueueRow) -> Event:
    return event_from_document(row.tenant, row.event)


def event_from_document(tenant: str, d: dict) -> Event:
    """The event a run gets, from its queue row's (or kept input's) document."""
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
        tenant=tenant,
        path=d.get("path"),  # type: ignore[arg-type]  # None for events sent directly
    )


class _ClaimLoop:
    """Claims for one shard of this worker's instances. Shards claim
    concurrently, so one shard's round trip to the store overlaps the other
    shards' runs (a loop alone alternates: claim, run, claim)."""

    def __init__(self, scheduler: Scheduler, shard: int) -> None:
        self.scheduler = scheduler
        self.shard = shard
        self.dirty: set[str] = set()
        self.all = True
        self.wake_flag = asyncio.Event()
        # Finished rows waiting to be deleted, per tenant (with the next claim).
        self.done: dict[str, list[Completion]] = defaultdict(list)
        # Retries scheduled for this shard's rows, (due, tenant): claim again when due.
        self.retries: list[tuple[int, str]] = []
        self.idle = asyncio.Event()  # set after a claim pass found nothing to do

    def wake(self, tenant: str | None) -> None:
        if tenant is None:
            self.all = True
        else:
            self.dirty.add(tenant)
        self.idle.clear()
        self.wake_flag.set()

    async def run(self) -> None:
        s = self.scheduler
        now_ms = s.kernel.now_ms
        while not s.stopping:
            # Woken at the next retry's due time (by the clock: one that
            # jumps wakes it too), by the periodic sweep at the latest.
            due_s = self.retries[0][0] / 1000 if self.retries else None
            try:
                async with s.kernel.clock.alarm(due_s, within=s.sweep_s):  # not wait_for: see Fanout.run
                    await self.wake_flag.wait()
            except TimeoutError:
                if not self.retries or self.retries[0][0] > now_ms():
                    self.all = True  # the periodic sweep
            self.wake_flag.clear()
            if s.stopping:  # woken by stop(): no pass, not even the tenants' query
                break
            while self.retries and self.retries[0][0] <= now_ms():
                self.dirty.add(heapq.heappop(self.retries)[1])
            claimed = 0
            try:
                claimed = await self._claim_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "claiming failed; retrying")
                self.all = True
                await asyncio.sleep(0.5)
                continue
            # Quiet: nothing claimed, nothing running, nothing left to do.
            if not claimed and not s.running and not self.dirty and not self.done:
                self.idle.set()

    async def _claim_pass(self) -> int:
        s = self.scheduler
        actors = s.kernel.actors()
        claimed = 0
        if self.all:
            self.all = False
            self.dirty.update(await actors.tenants())
        dirty, self.dirty = self.dirty | set(self.done), set()
        for tenant in dirty:
            while not s.stopping:
                # Finished rows are deleted by the same round trip that
                # claims the next ones.
                done = self.done.pop(tenant, [])
                free = max(s.max_in_flight - len(s.running), 0)
                if free == 0 and not done:
                    self.dirty.add(tenant)  # revisit when a run finishes
                    break
                try:
                    rows = await actors.claim(
                        tenant, s.worker_id, s.policies, s.kernel.now_ms(), free, done,
                        shard=(self.shard, len(s.loops)),
                    )
                except BaseException:
                    # The deletes may not have happened (a lost connection):
                    # the next claim sends them again. Harmless if they did:
                    # the delete is fenced by status and attempts.
                    if done:
                        self.done[tenant] = done + self.done.get(tenant, [])
                    raise
                claimed += len(rows)
                await s.load_instances(tenant, rows)
                for row in rows:
                    task = asyncio.create_task(s.run_row(row, self), name=f"yoke-process-{row.qid}")
                    s.running.add(task)
                    task.add_done_callback(s.run_ended)
                if free == 0:  # only completions went: revisit when a run finishes
                    self.dirty.add(tenant)
                    break
                if len(rows) < free:
                    break
        return claimed


class Scheduler:
    def __init__(
        self, kernel: ActorKernel, app: App, worker_id: str, *, max_in_flight: int, sweep_s: float,
        shards: int = 2, pools: dict[str, HostPool] | None = None, code_version: str | None = None,
    ) -> None:
        self.kernel = kernel
        # What each input it finishes is kept as having run on (store/inputs.py):
        # the deployment's version, else each actor's own code.
        self.code_version = code_version
        self.code_of = {name: code_of(d) for name, d in app.actors.items()}
        # Actors whose process() runs in a host, and their pools (docs/advanced/hosts.md).
        self.pools = pools or {}
        self._app = app
        self.worker_id = worker_id
        self.max_in_flight = max_in_flight
        self.sweep_s = sweep_s
        self.policies = [
            Policy(d.name, d.concurrency, int(d.timeout_s * 1000) + LEASE_GRACE_MS
                   + (HOST_WAIT_MS if d.name in self.pools else 0))
            for d in app.actors.values()
        ]
        self.running: set[asyncio.Task[None]] = set()
        # Instances of claimed rows: a cache (a miss reads the row), bounded
        # because instances are made from event data (keyed actors); the
        # oldest remembered go first.
        self._instances: dict[tuple[str, str], InstanceInfo] = {}
        self.max_instances = MAX_INSTANCES
        self.loops = [_ClaimLoop(self, shard) for shard in range(max(shards, 1))]
        self._loop_tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        self.on_run = None  # test hook: (row, started, finished, ok) -> None

    @property
    def in_flight(self) -> int:
        return len(self.running)

    def wake(self, tenant: str | None = None) -> None:
        for loop in self.loops:
            loop.wake(tenant)

    async def wait_quiet(self) -> None:
        """Until every claim loop found nothing to do (in this process)."""
        while True:
            for loop in self.loops:
                await loop.idle.wait()
            if all(loop.idle.is_set() for loop in self.loops):
                return

    def run_ended(self, task: asyncio.Task[None]) -> None:
        """A run's task is done (its ``_settle`` woke the loop that claimed
        it). ``running`` is shared by every loop: a loop that saw this run
        in it stayed not idle, and one that found no free slot left its
        tenant dirty; neither hears of the run otherwise, and would wait
        for the sweep. Wake them now that the run is out of ``running``."""
        self.running.discard(task)
        for loop in self.loops:
            if loop.dirty or (not self.running and not loop.idle.is_set()):
                loop.wake_flag.set()

    def forget_instances(self) -> None:
        self._instances.clear()

    async def run(self) -> None:
        if not self.policies:  # an application with portals only: nothing to claim
            for loop in self.loops:
                loop.idle.set()
            return
        self._loop_tasks = [
            asyncio.create_task(loop.run(), name=f"yoke-claim-{loop.shard}") for loop in self.loops
        ]
        try:
            await asyncio.gather(*self._loop_tasks)
        finally:
            for task in self._loop_tasks:
                task.cancel()

    # --- running -----------------------------------------------------------

    async def load_instances(self, tenant: str, rows: list[QueueRow]) -> None:
        """Look up the instances of newly claimed rows in one query."""
        missing = {r.instance_id for r in rows if (tenant, r.instance_id) not in self._instances}
        if missing:
            for info in await self.kernel.actors().get_instances(tenant, sorted(missing)):
                self._remember(info)

    async def _instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        key = (tenant, instance_id)
        info = self._instances.get(key)
        if info is None:
            info = await self.kernel.actors().get_instance(tenant, instance_id)
            if info is not None:
                self._remember(info)
        return info

    def _remember(self, info: InstanceInfo) -> None:
        instances = self._instances
        key = (info.tenant, info.instance_id)
        if key not in instances and len(instances) >= self.max_instances:
            del instances[next(iter(instances))]
        instances[key] = info

    async def run_row(self, row: QueueRow, loop: _ClaimLoop) -> None:
        # The run's changes reach the SQL catalogue when it ends, together
        # (actors/sql_mirror.py).
        databases = self.kernel.state_databases()
        databases.hold(row.tenant, row.instance_id)
        try:
            await self._run_row(row, loop)
        finally:
            databases.release(row.tenant, row.instance_id)

    async def _run_row(self, row: QueueRow, loop: _ClaimLoop) -> None:
        definition = self._app.actors[row.actor]
        clock = self.kernel.clock
        started = clock.wall()
        ok = False
        error = tb = ""
        # The run must end before its lease does (another worker may claim
        # the row then): its time is the actor's timeout, cut short when the
        # run starts late, and a row whose lease is nearly over does not start.
        pool = self.pools.get(row.actor)
        isolated = pool is not None
        budget_s = definition.timeout_s
        host = None
        output: RunOutput | None = None  # what an isolated run printed, kept with its failure
        handed = False  # the host went to process(), which gives it back
        atomic: AtomicRun | None = None
        tape = Tape()  # kept with the input when the run ends (tape.py)
        tracing = self.kernel.tracing
        span = None  # the attempt's span, ended with the attempt (tracing.py)
        if tracing.on:
            span = tracing.start_attempt(
                tenant=row.tenant, actor=row.actor, instance_id=row.instance_id, key=None, qid=row.qid,
                attempt=row.attempts, event=row.event, path=row.path, enqueued_at=row.enqueued_at,
                available_at=row.available_at, started_ms=int(started * 1000),
            )
        try:
            # An isolated run waits for a free host first: outside its time.
            host = await pool.acquire() if pool is not None else None
            budget_s = min(definition.timeout_s, (row.lease_until - LEASE_MARGIN_MS - self.kernel.now_ms()) / 1000)
            if budget_s <= 0:
                raise LeaseLost("claimed, but its lease ran out before process() could start")
            async with asyncio.timeout(budget_s):
                instance = await self._instance(row.tenant, row.instance_id)
                if instance is None:
                    raise LookupError(f"instance {row.instance_id} does not exist")
                ops = OpHandler(
                    self.kernel, self._app, row.tenant, instance, Journal(row.qid, instance.instance_id),
                    worker_id=self.worker_id, span=span, tape=tape,
                )
                if span is not None and instance.key is not None:
                    span.set_attribute("yoke.key", instance.key)
                if definition.effects == "atomic":
                    atomic = ops.atomic = AtomicRun(self.kernel, instance, row)
                    atomic.kept = lambda: self._kept(row, tape)
                if atomic is not None and await atomic.start():
                    pass  # its run committed here before: commit() performs what it recorded
                elif host is not None:
                    handed = True
                    output = RunOutput(f"{instance.actor} {instance.key or '-'} {instance.instance_id}"
                                       f" row {row.qid} attempt {row.attempts}")
                    await pool.process(host, ops, instance, event_from_queue(row), row.attempts, output,
                                       trace=None if span is None else carrier_of(span))
                else:
                    ctx = Context(ops, instance, event_from_queue(row), row.attempts, row.qid)
                    with in_run(span):  # the handler's own spans are children of the attempt's
                        await definition.handler(ctx, ctx.event)  # type: ignore[misc]
                if atomic is not None:
                    await atomic.commit()  # the row's completion is part of it
            ok = True
        except TimeoutError:
            error = f"process() timed out after {budget_s:.3g}s"
            if isolated:
                error += "; its host was killed"
            tb = traceback.format_exc()
        except HandlerFailed as exc:  # raised in its host: the host's traceback
            error, tb = exc.message, exc.traceback
        except HostFailure as exc:
            error, tb = f"host failure: {exc}; the run's host was replaced", ""
        except asyncio.CancelledError:
            error, tb = "worker shut down during process()", ""
            await self._settle(row, loop, definition, False, error, tb, tape, cancelled=True)
            raise
        except Exception as exc:  # the actor's failure, recorded on the row
            error = f"{type(exc).__name__}: {exc}"
            tb = traceback.format_exc()
        finally:
            if span is not None:
                if not ok and row.attempts >= definition.max_attempts and not error.startswith("worker shut down"):
                    span.set_attribute("yoke.dead_lettered", True)
                end(span, None if ok else error or "the run did not finish", stacktrace=tb)
            if host is not None and not handed:  # acquired, but process() was not reached
                pool.release(host)  # type: ignore[union-attr]
            if atomic is not None:
                await atomic.abort()  # nothing if it committed
        if not ok and output is not None:
            tb += output.section()
        finished = clock.wall()
        if self.on_run is not None:
            self.on_run(row, started, finished, ok)
        metrics.observe_process(row, definition, ok, finished - started)
        await self._settle(row, loop, definition, ok, error, tb, tape, completed=atomic is not None)

    def _kept(self, row: QueueRow, tape: Tape) -> Completion:
        """Row ``row``'s run ended: the input to keep (store/inputs.py), unless
        its actor keeps none (``keep_inputs=0``: writing it costs the
        scheduler about a fifth of its runs per second, docs/advanced/forks.md)."""
        if self._app.actors[row.actor].keep_inputs == 0:
            return Completion(row.qid, row.attempts, keep=False)
        return Completion(row.qid, row.attempts, self.kernel.now_ms(), self.code_version or self.code_of.get(row.actor),
                          tape.json())

    async def _settle(
        self, row: QueueRow, loop: _ClaimLoop, definition: ActorDef, ok: bool, error: str, tb: str,
        tape: Tape, *, cancelled: bool = False, completed: bool = False,
    ) -> None:
        if ok:
            if completed:  # an atomic run's commit deleted it: claim the next rows
                loop.wake(row.tenant)
                return
            loop.done[row.tenant].append(self._kept(row, tape))
            loop.idle.clear()
            loop.wake_flag.set()
            return
        now_ms = self.kernel.now_ms
        if cancelled:
            retry_at: int | None = now_ms()
        elif row.attempts >= definition.max_attempts:
            retry_at = None
            log.warning("dead-lettered %s row %s after %s attempts: %s",
                        row.instance_id, row.qid, row.attempts, error)
        else:
            delay_s = backoff_s(row.attempts, definition.retry_base_s, definition.retry_max_s,
                                row.tenant, row.qid)
            retry_at = now_ms() + int(delay_s * 1000)
            heapq.heappush(loop.retries, (retry_at, row.tenant))
        try:
            await self.kernel.actors().fail(
                row.tenant, row.qid, row.attempts, retry_at=retry_at,
                error=error[:MAX_ERROR_CHARS], traceback=tb[-MAX_ERROR_CHARS * 4 :],
                kept=None if retry_at is not None else self._kept(row, tape),
            )
        except Exception:
            log.exception("could not record the failure of row %s; its lease will expire", row.qid)
        loop.wake(row.tenant)

    async def flush_completions(self) -> None:
        for loop in self.loops:
            done, loop.done = loop.done, defaultdict(list)
            for tenant, rows in done.items():
                await self.kernel.actors().complete(tenant, rows)

    async def stop(self, timeout_s: float) -> None:
        """Stop claiming; let runs finish for ``timeout_s``, then cancel them
        (their rows go back to pending).

        A claim already on its way to the store when the stop begins comes
        back with leased rows, and its loop starts their runs before it sees
        ``stopping``: so the claim loops end first, and only then is
        ``running`` complete. Waiting on a snapshot taken earlier let such
        runs start after the stop returned, under a closing runtime, and
        their rows sat leased until the lease ran out."""
        self.stopping = True
        for loop in self.loops:
            loop.wake_flag.set()
        clock = self.kernel.clock
        deadline = clock.monotonic() + timeout_s
        loops = [task for task in self._loop_tasks if not task.done()]
        if loops:
            _, stuck = await asyncio.wait(loops, timeout=timeout_s)
            for task in stuck:  # a claim that did not come back in time
                task.cancel()
            if stuck:
                await asyncio.wait(stuck)
        while self.running and (remaining := deadline - clock.monotonic()) > 0:
            await asyncio.wait(set(self.running), timeout=remaining)
        if self.running:
            pending = set(self.running)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        await self.flush_completions()
