"""Append with group commit.

One ``Appender`` per stream per process. Concurrent ``append`` and
``append_many`` calls queue up while a commit is in flight; the next commit
takes everything queued (up to ``max_group_events``) into one transaction:
lock the stream row, take the offsets, insert every row in one statement,
commit, resolve each caller, then wake the tails. A caller's batch stays
atomic, and an invalid or conflicting batch fails only its own call.

When the database is unavailable (``errors.Unavailable``), the group is
committed again for a few seconds: every call in it when the failure says
nothing was written (no connection, or a statement the server cancelled or
rolled back on a conflict: ``faults.NOTHING_WRITTEN``); otherwise (a lost
connection, whose commit may or may not have happened) only the calls whose
every event carries an idempotency key (a repeat returns the original
offsets), and the others fail with ``Unavailable`` at once: only their
caller can tell whether to retry (with keys, it is safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import errors, metrics
from ..clock import SYSTEM, Clock, wall_ms
from ..events import AppendResult, PreparedEvent, any_ephemeral, idempotency_keys, total_size
from ..lifecycle import GLOBAL
from ..lifecycle import new_stream_id  # noqa: F401 - where the rest of Yoke imports it from
from ..store.contract import Admitted, CommitResult, Outcome, Store
from ..store.faults import Backoff, nothing_written
from ..store.durable_streams import Guard, GuardOutcome
from ..tracing import Tracing
from .ephemeral import EphemeralBuffer, EphemeralBuffers
from .wakeups import WakeupHub

log = logging.getLogger("yoke.streams.append")


@dataclass(slots=True)
class _Request:
    events: Sequence[PreparedEvent]
    future: asyncio.Future[Any]
    guard: Guard | None = None  # a protocol append's checks (store/durable_streams.py)
    last_only: bool = False  # the caller needs only its last event's result


@dataclass(frozen=True, slots=True)
class GuardedAppend:
    """What a guarded append got: its events' results (none when the guard
    refused it), the guard's decision, and the stream's head after the group."""

    results: list[AppendResult]
    outcome: GuardOutcome
    head: int


# Outcome statuses that refuse a caller's whole batch.
REFUSALS = ("conflict", "object", "closed", "unread_full", "quota")


def first_refusal(outcomes: Sequence[Outcome]) -> str | None:
    """The status of the first refused event, if any (none when the store
    says it took them all, without making their outcomes)."""
    if isinstance(outcomes, Admitted):
        return None
    return next((o.status for o in outcomes if o.status in REFUSALS), None)


# A producer blocked on credit rechecks at least this often (acks made by
# other processes on SQLite arrive without a wake-up).
CREDIT_RECHECK_S = 0.25
RETRY_AFTER_S = 1
# How long a group commit keeps trying while the database is unavailable.
APPEND_RETRY_S = 3.0


def refusal_error(status: str, path: str, events: Sequence[PreparedEvent]) -> errors.YokeError:
    if status == "conflict":
        keys = [e.idempotency_key for e in events if e.idempotency_key is not None]
        return errors.IdempotencyConflict("idempotency key already used for a different event", keys=keys)
    if status == "closed":
        return errors.StreamClosed(f"stream {path} is closed", path=path)
    if status == "object":
        return errors.ObjectStateConflict("the referenced object is not uploaded", state="not_uploaded")
    if status == "unread_full":
        return errors.Backpressure(
            f"stream {path} reached its unread ceiling", path=path, retry_after=RETRY_AFTER_S
        )
    return errors.QuotaExhausted(f"stream {path} reached its total ceiling", path=path)


def _keyed(request: _Request) -> bool:
    return all(e.idempotency_key is not None for e in request.events)


def _fail(request: _Request, error: Exception) -> None:
    if not request.future.done():  # the caller may have been cancelled
        request.future.set_exception(error)


class Appender:
    """Group commit for one stream.

    Up to ``MAX_INFLIGHT`` commits run at once, so the next group is being
    assembled and sent while the previous one commits (they still commit one
    after the other, under the stream row lock). A group holding ephemeral
    events runs alone, so readers have at most one such commit to wait for
    (see ``ephemeral``), and holds no guarded (protocol) append: a guarded
    commit takes the store's guarded path, which does not relay ephemeral
    events to other processes.
    """

    MAX_INFLIGHT = 2

    def __init__(self, service: AppendService, tenant: str, path: str) -> None:
        self._service = service
        self.tenant = tenant
        self.path = path
        self._queue: deque[_Request] = deque()
        self._commits: set[asyncio.Task[None]] = set()
        self._ephemeral_inflight = False
        self._pump_scheduled = False

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._commits)

    def submit(
        self, events: Sequence[PreparedEvent], guard: Guard | None = None, *, last_only: bool = False
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Request(events, future, guard, last_only))
        if not self._pump_scheduled:
            # Start on the next loop turn, so every caller woken by the last
            # commit gets to queue its next append into the same group.
            self._pump_scheduled = True
            loop.call_soon(self._pump)
        return future

    def _pump(self) -> None:
        self._pump_scheduled = False
        while self._queue and len(self._commits) < self.MAX_INFLIGHT and not self._ephemeral_inflight:
            group = self._take_group(allow_ephemeral=not self._commits)
            if not group:
                break
            task = asyncio.create_task(self._commit(group), name=f"yoke-append:{self.tenant}:{self.path}")
            self._commits.add(task)
            task.add_done_callback(self._committed)

    def _committed(self, task: asyncio.Task[None]) -> None:
        self._commits.discard(task)
        self._pump()
        if not self.busy:
            self._service._idle(self)

    def _take_group(self, *, allow_ephemeral: bool) -> list[_Request]:
        """Queued requests for one transaction: at most ``max_group_events``
        events (but at least one request), no idempotency key twice (a
        repeated key waits for the next commit, which then sees the first
        one), and ephemeral events only when nothing else is in flight."""
        limit = self._service.max_group_events
        group: list[_Request] = []
        keys: set[str] = set()
        count = 0
        guarded = ephemeral = False
        while self._queue:
            request = self._queue[0]
            has_ephemeral = any_ephemeral(request.events)
            if has_ephemeral and not allow_ephemeral:
                break
            request_keys = set(idempotency_keys(request.events))
            if group and (count + len(request.events) > limit or keys & request_keys):
                break
            if group and ((has_ephemeral and guarded) or (request.guard is not None and ephemeral)):
                break
            self._queue.popleft()
            group.append(request)
            keys |= request_keys
            count += len(request.events)
            guarded = guarded or request.guard is not None
            ephemeral = ephemeral or has_ephemeral
            if has_ephemeral:
                self._ephemeral_inflight = True
        return group

    async def _commit(self, group: list[_Request]) -> None:
        service = self._service
        backoff: Backoff | None = None
        while True:
            events: list[PreparedEvent] = []
            batch_of: list[int] = []
            for index, request in enumerate(group):
                events.extend(request.events)
                batch_of.extend([index] * len(request.events))
            has_ephemeral = any_ephemeral(events)
            buffer = service.buffers.ensure(self.tenant, self.path) if has_ephemeral else None
            if buffer is not None:
                buffer.begin_commit()
            now = wall_ms(service.clock)
            guards = [r.guard for r in group] if any(r.guard is not None for r in group) else None
            try:
                result = await service.store.commit(
                    self.tenant, self.path, events, batch_of, now, new_stream_id(), guards
                )
                break
            except BaseException as exc:
                if buffer is not None:
                    buffer.end_commit()
                failure = exc if isinstance(exc, Exception) else errors.RuntimeClosed()
                if isinstance(exc, errors.Unavailable) and not service.closing:
                    # Nothing written (no connection, a statement rolled
                    # back): every caller can be committed again. Otherwise
                    # the commit may or may not have happened: only callers
                    # whose every event carries an idempotency key can be
                    # committed again safely (a repeat returns the original
                    # offsets); the others learn that the outcome is unknown.
                    everyone = nothing_written(exc)
                    retry = [r for r in group if (everyone or _keyed(r)) and not r.future.done()]
                    kept = {id(r) for r in retry}
                    for request in group:
                        if id(request) not in kept:
                            _fail(request, failure)
                    group = retry
                    if has_ephemeral:  # it keeps running alone while it retries ephemeral events
                        self._ephemeral_inflight = any(e.ephemeral for r in group for e in r.events)
                    backoff = backoff or Backoff(APPEND_RETRY_S)
                    try:
                        again = bool(group) and await backoff.wait()
                    except BaseException:
                        if has_ephemeral:
                            self._ephemeral_inflight = False
                        for request in group:
                            _fail(request, errors.RuntimeClosed())
                        raise
                    if again:
                        log.info("append to %s %s: %s; committing %s calls again",
                                 self.tenant, self.path, exc.message, "the" if everyone else "the keyed")
                        continue
                if has_ephemeral:
                    self._ephemeral_inflight = False
                for request in group:
                    _fail(request, failure)
                if not isinstance(exc, Exception):
                    raise
                if isinstance(exc, errors.Unavailable):
                    log.warning("append to %s %s failed: %s", self.tenant, self.path, exc.message)
                else:
                    log.error("append to %s %s failed: %r", self.tenant, self.path, exc)
                return
        self._settle(group, events, result, now, buffer)
        if has_ephemeral:
            self._ephemeral_inflight = False

    def _settle(
        self,
        group: list[_Request],
        events: list[PreparedEvent],
        result: CommitResult,
        now: int,
        buffer: EphemeralBuffer | None,
    ) -> None:
        # No await in here: buffer the ephemeral events and settle the commit
        # in the same turn it is observed, then resolve the callers, then wake.
        service = self._service
        position = 0
        appended = appended_bytes = 0  # the metrics, once per commit rather than per call
        for index, request in enumerate(group):
            outcomes = result.outcomes[position : position + len(request.events)]
            prepared = events[position : position + len(request.events)]
            position += len(request.events)
            decision = result.guards[index] if result.guards is not None else None
            if decision is not None and decision.status != "ok":
                if request.guard is None:  # only a close refuses an unguarded batch
                    _fail(request, refusal_error("closed", self.path, prepared))
                elif not request.future.done():
                    request.future.set_result(GuardedAppend([], decision, result.head))
                continue
            refusal = first_refusal(outcomes)
            if refusal is not None:
                _fail(request, refusal_error(refusal, self.path, prepared))
                continue
            if buffer is not None:
                for e, o in zip(prepared, outcomes):
                    if e.ephemeral and o.status == "ok":
                        assert o.offset is not None
                        buffer.add(e, o.offset, now)
            appended += len(prepared)
            appended_bytes += total_size(prepared)
            if not request.future.done():
                mine = outcomes[-1:] if request.last_only else outcomes
                results = [AppendResult(o.offset, o.id, o.at, o.status == "duplicate") for o in mine]  # type: ignore[arg-type]
                if request.guard is not None and decision is not None:
                    request.future.set_result(GuardedAppend(results, decision, result.head))
                else:
                    request.future.set_result(results)
        if buffer is not None:
            buffer.end_commit()
        if appended:
            metrics.APPENDS.labels(self.tenant).inc(appended)
            metrics.APPENDED_BYTES.labels(self.tenant).inc(appended_bytes)
        service.appended(self.tenant, self.path, len(events))


SEEN_STREAMS = 10_000  # streams appended() remembers having announced on '/'


class AppendService:
    """Validates calls and routes them to the stream's appender."""

    def __init__(
        self,
        store: Store,
        hub: WakeupHub,
        buffers: EphemeralBuffers,
        *,
        max_group_events: int,
        clock: Clock = SYSTEM,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.tracing = tracing or Tracing()  # a span around each call's commit, when on
        self.clock = clock  # stamps each commit (the events' created_at)
        self.hub = hub
        self.buffers = buffers
        self.max_group_events = max_group_events
        self._appenders: dict[tuple[str, str], Appender] = {}
        self._drained: asyncio.Event | None = None
        self.closing = False
        self.stop_waiting = False  # set at shutdown: blocked producers give up
        self._seen: dict[tuple[str, str], None] = {}  # streams committed to, oldest first (appended())

    async def append(
        self, tenant: str, path: str, events: Sequence[PreparedEvent]
    ) -> list[AppendResult]:
        if self.closing:
            raise errors.RuntimeClosed("the runtime is shutting down")
        if not events:
            return []
        keys = [e.idempotency_key for e in events if e.idempotency_key is not None]
        if len(keys) != len(set(keys)):
            raise errors.InvalidIdempotencyKey("an idempotency key appears twice in one batch")
        limit = self.buffers.max_event_size
        for e in events:
            if e.ephemeral and e.size > limit:
                # Rejected before an offset is taken.
                raise errors.EphemeralTooLarge(
                    f"ephemeral event of {e.size} bytes exceeds the {limit} bytes the ephemeral"
                    " buffer caps admit for one event",
                    size=e.size,
                    limit=limit,
                )
        if not self.tracing.on:
            return await self._committed(tenant, path, events)
        # Checked as the caller sent them; the trace context they then carry is not the caller's to count.
        with self.tracing.sending(tenant, path, events) as span:
            results = await self._committed(tenant, path, events)
            span.set_attribute("yoke.offset", results[0].offset)
            if all(r.duplicate for r in results):
                span.set_attribute("yoke.duplicate", True)
            return results

    async def _committed(
        self, tenant: str, path: str, events: Sequence[PreparedEvent]
    ) -> list[AppendResult]:
        """The commit of a checked call, waiting for producer credit when the
        stream's overflow policy is 'block'."""
        deadline: float | None = None
        waiter = None
        started = time.perf_counter()
        try:
            while True:
                try:
                    results = await self._submit(tenant, path, events)
                    metrics.APPEND_LATENCY.observe(time.perf_counter() - started)
                    return results
                except errors.Backpressure:
                    # Overflow policy 'block': wait for acknowledgements to
                    # free credit, up to the stream's block timeout.
                    if self.closing or self.stop_waiting:
                        raise errors.RuntimeClosed("the runtime is shutting down") from None
                    info = await self.store.info(tenant, path)
                    if info is None or info.limits.overflow != "block":
                        raise
                    loop = asyncio.get_running_loop()
                    if deadline is None:
                        deadline = loop.time() + info.limits.block_timeout_s
                        waiter = self.hub.subscribe(tenant, path)
                    remaining = deadline - loop.time()
                    if remaining <= 0 or waiter is None:
                        raise
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, CREDIT_RECHECK_S)):
                            await waiter.wait()
                    if self.closing or self.stop_waiting:
                        # Woken by the shutdown: the store may already be
                        # closing, so do not try the commit again.
                        raise errors.RuntimeClosed("the runtime is shutting down")
        finally:
            if waiter is not None:
                waiter.close()

    def _submit(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], guard: Guard | None = None,
        *, last_only: bool = False,
    ) -> asyncio.Future[Any]:
        appender = self._appenders.get((tenant, path))
        if appender is None:
            appender = self._appenders[(tenant, path)] = Appender(self, tenant, path)
        # A cancelled caller cancels only its own future: the shared commit
        # goes on (and may still write its events).
        return appender.submit(events, guard, last_only=last_only)

    async def append_protocol(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], guard: Guard | None
    ) -> GuardedAppend | list[AppendResult]:
        """A Durable Streams append (yoke/http/durable_streams): the same
        group commit; with a guard (producer, Stream-Seq, close; a close may
        carry no event) the store decides it in the append's transaction and
        the answer is a ``GuardedAppend``. The stream must exist. Results:
        the last event's only (the protocol answers with the next offset)."""
        if self.closing:
            raise errors.RuntimeClosed("the runtime is shutting down")
        started = time.perf_counter()
        if self.tracing.on and events:
            with self.tracing.sending(tenant, path, events, operation="protocol_append"):
                answer = await self._submit(tenant, path, events, guard, last_only=True)
        else:
            answer = await self._submit(tenant, path, events, guard, last_only=True)
        metrics.APPEND_LATENCY.observe(time.perf_counter() - started)
        return answer

    @property
    def appenders(self) -> int:
        """Streams with appends queued or committing (an idle stream has none)."""
        return len(self._appenders)

    def stop_blocking(self) -> None:
        """Shutdown: appends waiting for credit fail with RuntimeClosed now."""
        self.stop_waiting = True
        self.hub.wake_all()

    def appended(self, tenant: str, path: str, count: int) -> None:
        """Called after each commit, after callers are resolved. The first
        commit this process sees on a stream may have created it: then its
        ``yoke.stream.created`` fact on '/' is announced too (or fan-out,
        hearing of '/' on its sweep alone, routes it a second late)."""
        self.hub.wake(tenant, path)
        key = (tenant, path)
        if key not in self._seen:
            if len(self._seen) >= SEEN_STREAMS:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = None
            if path != GLOBAL:
                self.hub.wake(tenant, GLOBAL)

    def _idle(self, appender: Appender) -> None:
        if self._appenders.get((appender.tenant, appender.path)) is appender:
            del self._appenders[(appender.tenant, appender.path)]
        if not self._appenders and self._drained is not None:
            self._drained.set()

    async def drain(self) -> None:
        """Wait until every queued append is committed."""
        if self._appenders:
            self._drained = asyncio.Event()
            await self._drained.wait()
