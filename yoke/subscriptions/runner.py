"""Delivering one subscription: read after the cursor, filter, transform,
send, acknowledge; the retry ladder, skips and halts.

One ``Runner`` per subscription, in the process that holds its lease. Each
step reads a page after ``processed_through_offset``, sends the matching
events in batches (1,000 events or 1 MiB for copy and call, one event for
webhook and processor), and then advances the cursor through everything it
scanned, with the generation it read: an acknowledgement that arrives after
an operator moved the cursor (a newer generation) changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..clock import backoff_s, wall_ms
from ..events import Event
from ..lifecycle import is_lifecycle
from ..routing.evaluation import Failed
from ..routing.filters import Filter, failure
from ..store.subscriptions import Checkpoint, SubscriptionRow
from ..tracing import ending
from . import copies, processors, webhooks
from .catalogue import (
    AUDIT,
    CONFIGURED,
    CURSOR_SET,
    MAX_ERROR_CHARS,
    REMOVED,
    decide_halt,
    decide_resume,
    decide_skip,
    deploy_resumable,
    first_hand,
)
from .batch import Batch
from .receivers import MAX_BATCH_BYTES, MAX_BATCH_EVENTS

if TYPE_CHECKING:
    from ..routing.evaluation import Evaluations
    from .deliveries import Deliveries

log = logging.getLogger("yoke.subscriptions")

READ_PAGE = 1000
MAX_ATTEMPTS = 15  # failed attempts before a halt
SKIP_AFTER = 3  # attempts before on_failing_event="skip" skips the event
SKIPS_IN_A_ROW = 3  # the third consecutive failing event halts instead of being skipped
STEP_BUDGET_S = 0.05  # one-event receivers: acknowledge at least this often
RUN_ENDING = frozenset({CONFIGURED, CURSOR_SET, REMOVED})


def transformed(event: Event, shaped: Any) -> Event:
    """The event reshaped by a transform's value ``shaped``: ``{type?,
    payload?, metadata?}`` replace those fields; coordinates and provenance
    stay the source's."""
    if not isinstance(shaped, dict) or set(shaped) - {"type", "payload", "metadata"}:
        raise errors.InvalidTransform("a transform must produce an object with type, payload or metadata")
    if "metadata" in shaped and not isinstance(shaped["metadata"], dict):
        raise errors.InvalidTransform("a transform's metadata must be an object")
    return replace(
        event,
        type=shaped.get("type", event.type),
        payload=shaped.get("payload", event.payload),
        metadata=shaped.get("metadata", event.metadata),
    )


async def transform_one(evaluations: Evaluations, tenant: str, event: Event, expression: str) -> Event:
    """``event`` reshaped by the transform ``expression``."""
    [value] = await evaluations.run(tenant, expression, "transform", [event.to_dict()])
    if type(value) is Failed:
        raise failure("transform", value.message, expression)
    return transformed(event, value)


class Runner:
    def __init__(self, engine: Deliveries, row: SubscriptionRow) -> None:
        self.engine = engine
        self.row = row
        self.dirty = False
        # Another process is preferred for it now: stop between two steps
        # (never in the middle of a delivery), and the engine gives it up.
        self.leaving = False
        # After a failure, batches of one event until the event that failed
        # is through (and its attempts count on until then).
        self.failing: int | None = row.cursor + 1 if row.attempts > 0 else None
        self._poke = asyncio.Event()
        self._checkpoint: Checkpoint | None = None
        self._created_at: int | None = None  # the source's, for stamps and hops
        self._head = 0  # the source's head at the last read
        # What /metrics shows of this subscription while this runner holds it
        # (metrics.HeldSubscriptions reads them when scraped).
        self.delivered = 0
        self.failures = 0
        self.lag = 0
        self.halted = False
        self._configure(row)

    def _configure(self, row: SubscriptionRow) -> None:
        c = row.config
        self.kind = c["kind"]
        self.filter = Filter.from_dict(c["filter"]) if c.get("filter") else None
        self.transform = c.get("transform")
        self.batch_events = MAX_BATCH_EVENTS if self.kind in ("copy", "call") else 1
        self._checkpoint = None

    def update(self, row: SubscriptionRow) -> None:
        """The row as a sweep read it: reread it after an operator's change
        made elsewhere; look again when the source is ahead of the cursor
        (the safety net for a wake-up that never came). Otherwise nothing:
        an idle runner stays asleep."""
        if (row.generation, row.halted, row.config) != (self.row.generation, self.row.halted, self.row.config):
            self.dirty = True
            self.poke()
        elif row.head > row.cursor:
            self.poke()

    def poke(self) -> None:
        self._poke.set()

    def leave(self) -> None:
        self.leaving = True
        self.poke()

    # --- the loop --------------------------------------------------------------

    async def run(self) -> None:
        r = self.row
        # Woken by the source's appends (this process's, and others' through
        # LISTEN), not by the tails' periodic sweep: the engine's sweep is
        # this runner's safety net.
        waiter = self.engine.hub.subscribe(r.tenant, r.path, sweeps=False)
        try:
            while True:
                if self.leaving:
                    return
                if self.dirty and not await self._reload():
                    return
                row = self.row
                if row.halted is not None:
                    if not await self._resume_on_new_version():
                        self.halted = True
                        return
                    continue
                self.halted = False
                if not self.engine.holding:
                    return  # the lease ran out: whoever holds it next resumes from the cursor
                if row.next_retry_at > wall_ms(self.engine.clock):
                    await self._wait(None, row.next_retry_at / 1000)
                    continue
                if not await self.step():
                    await self._wait(waiter, None)  # until an append, a poke or a resync
        finally:
            waiter.close()

    async def _wait(self, waiter: Any, due_s: float | None) -> None:
        """Until a poke, an append (``waiter``) or the clock reaching ``due_s``."""
        waits = [asyncio.ensure_future(self._poke.wait())]
        if waiter is not None:
            waits.append(asyncio.ensure_future(waiter.wait()))
        try:
            with contextlib.suppress(TimeoutError):
                async with self.engine.clock.alarm(due_s):
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self._poke.clear()

    async def _reload(self) -> bool:
        r = self.row
        row = await self.engine.store().subscriptions.get(r.tenant, r.path, r.name)
        self.dirty = False
        if row is None or row.source_stream_id != r.source_stream_id:
            self.engine.changed(r.tenant, r.path, r.name)  # a new lifetime's: a new runner
            return False
        if row.config != r.config or row.generation != r.generation:
            self._configure(row)
            self.failing = row.cursor + 1 if row.attempts > 0 else None
        self.row = row
        return True

    async def _resume_on_new_version(self) -> bool:
        """A halt is a breaker: the first check under another deployment
        version resumes it (one resumed event, whichever process gets here)."""
        version = self.engine.version
        row = self.row
        if not version or row.halted is None or version in row.gave_up or not deploy_resumable(row.halted):
            return False
        resumed = await self.engine.control(row, decide_resume(row.name, row.path, deploy_version=version))
        if resumed is None:
            return await self._reload() and self.row.halted is None
        self.row = resumed
        self.failing = None
        return resumed.halted is None

    # --- one step ----------------------------------------------------------------

    async def step(self) -> bool:
        """Deliver what follows the cursor; False when there was nothing to do."""
        row = self.row
        store = self.engine.store()
        page = await store.read(row.tenant, row.path, row.cursor, READ_PAGE)
        if page.stream_id != row.source_stream_id:
            # The source was deleted (and maybe created again): this
            # subscription belonged to its old lifetime and never delivers again.
            self.dirty = True
            return True
        self._created_at = page.created_at
        self._head = page.head
        self.lag = max(page.head - row.cursor, 0)
        if not page.events:
            if page.head > row.cursor:  # only ephemeral (or pruned) offsets follow
                await self._ack(page.head, 0, None)
                return True
            return False
        chosen, through, broken = await self._select(page.events, page.head)
        if not chosen and broken is None and through == row.cursor:
            self.dirty = True  # the next event ends this run
            return True
        delivered = 0
        failure: tuple[list[Event], BaseException] | None = None
        checkpoint = None
        if chosen:
            if self.kind == "processor":
                try:
                    checkpoint = await self._processor_checkpoint()
                except processors.Superseded:
                    self.dirty = True  # an operator started another run meanwhile
                    return True
                except Exception as exc:  # a reduce that fails while rebuilding
                    await self._failed(chosen[0].offset, chosen[0].offset, exc)
                    return True
            started = self.engine.clock.monotonic()
            size = self.batch_events if self.failing is None else 1
            for start in range(0, len(chosen), size):
                group = chosen[start : start + size]
                if delivered and self.engine.clock.monotonic() - started > STEP_BUDGET_S:
                    through = group[0].offset - 1
                    break
                try:
                    checkpoint = await self._send(group, checkpoint)
                except Exception as exc:  # a receiver failure, whatever it raised
                    failure = (group, exc)
                    through = group[0].offset - 1
                    break
                delivered += len(group)
                if self.failing is not None:
                    through = group[-1].offset  # after a failure: one event, then look again
                    break
        elif broken is not None:
            failure = ([broken[0]], broken[1])
        if through > row.cursor or delivered:
            if checkpoint is not None:
                checkpoint = replace(checkpoint, through=through)
            if not await self._ack(through, delivered, checkpoint):
                return True
        if failure is not None:
            events, exc = failure
            await self._failed(events[0].offset, events[-1].offset, exc)
        return True

    async def _select(
        self, events: list[Event], head: int
    ) -> tuple[list[Event], int, tuple[Event, BaseException] | None]:
        """The events to send (transformed), the offset the step covers, and
        the first event whose filter or transform failed (when nothing precedes it)."""
        chosen: list[Event] = []
        size = 0
        through = self.row.cursor
        limit = 1 if self.failing is not None else (MAX_BATCH_EVENTS if self.batch_events > 1 else READ_PAGE)
        scan = events
        for i, event in enumerate(events):
            if self._ends_run(event):
                scan = events[:i]  # an operator change of this subscription: reread the row first
                break
        # The events as documents, made once for filter, transform and size.
        docs = [e.to_dict() for e in scan] if self.filter or self.transform or self.batch_events > 1 else None
        outs = await self._outs(scan, docs)
        for i, event in enumerate(scan):
            if i == len(outs):
                return chosen, through, None  # the rest is for the next step
            out = outs[i]
            if isinstance(out, BaseException):
                if chosen or through > self.row.cursor:
                    return chosen, through, None  # deliver the prefix first
                return [], through, (event, out)
            if out is not None:
                if self.batch_events > 1:
                    assert docs is not None
                    weight = len(orjson.dumps(docs[i] if out is event else out.to_dict()))
                else:
                    weight = 0
                if len(chosen) >= limit or (chosen and size + weight > MAX_BATCH_BYTES):
                    return chosen, through, None
                chosen.append(out)
                size += weight
            through = event.offset
        if scan is events and len(events) < READ_PAGE:
            through = max(through, head)  # trailing ephemeral offsets
        return chosen, through, None

    async def _outs(self, scan: list[Event], docs: list[dict[str, Any]] | None) -> list[Any]:
        """Per event of ``scan``: what to send (transformed), None (left
        out), or the exception its filter or transform raised; through the
        first exception, and after a failure (one event per step) through
        the first event to send. The expressions run through the runtime's
        evaluations (routing/evaluation.py): off the event loop when expensive."""
        evaluations = self.engine.evaluations
        tenant = self.row.tenant
        outs: list[Any] = []
        step = 1 if self.failing is not None else max(len(scan), 1)
        for start in range(0, len(scan), step):
            part = scan[start : start + step]
            parts = docs[start : start + step] if docs is not None else []
            # True: send as is; False: leave out; an Event: send that; an exception.
            entries: list[Any] = [not self._local_only(event) for event in part]
            if self.filter is not None:
                asked = [j for j, entry in enumerate(entries) if entry]
                verdicts = await evaluations.verdicts(tenant, self.filter, [parts[j] for j in asked])
                for j, verdict in zip(asked, verdicts):
                    failed = type(verdict) is Failed
                    entries[j] = failure("where", verdict.message, self.filter.where or "") if failed else verdict
                if len(verdicts) < len(asked):
                    del entries[asked[len(verdicts) - 1] + 1 :]  # nothing after the failure
            if self.transform:
                asked = [j for j, entry in enumerate(entries) if entry is True]
                values = await evaluations.run(
                    tenant, self.transform, "transform", [parts[j] for j in asked], stop_at_error=True
                )
                for j, value in zip(asked, values):
                    if type(value) is Failed:
                        entries[j] = failure("transform", value.message, self.transform)
                        continue
                    try:
                        entries[j] = transformed(part[j], value)
                    except Exception as exc:  # a value of the wrong shape
                        entries[j] = exc
            for event, entry in zip(part, entries):
                if isinstance(entry, BaseException):
                    outs.append(entry)
                    return outs
                outs.append(event if entry is True else entry or None)
                if self.failing is not None and outs[-1] is not None:
                    return outs
        return outs

    def _ends_run(self, event: Event) -> bool:
        """Is ``event`` this subscription's own configure, cursor move or
        removal, newer than the run being delivered? Then the run ends there."""
        return (
            event.type in RUN_ENDING and event.offset > self.row.generation and first_hand(event)
            and isinstance(event.payload, dict) and event.payload.get("name") == self.row.name
        )

    def _local_only(self, event: Event) -> bool:
        """Audit lines and lifecycle facts are local, never copied onward."""
        return self.kind == "copy" and (event.type == AUDIT or is_lifecycle(event.type))

    async def _send(self, events: list[Event], checkpoint: Checkpoint | None) -> Checkpoint | None:
        tracing = self.engine.tracing
        if not tracing.on:
            return await self._deliver(events, checkpoint)
        row = self.row
        span = tracing.start_delivery(
            tenant=row.tenant, path=row.path, name=row.name, kind=self.kind, attempt=row.attempts + 1,
            generation=row.generation, events=events,
        )
        with ending(span):
            return await self._deliver(events, checkpoint)

    async def _deliver(self, events: list[Event], checkpoint: Checkpoint | None) -> Checkpoint | None:
        row = self.row
        batch = Batch(
            row.tenant, row.path, row.name, row.source_stream_id,
            self._created_at or 0, row.generation, row.attempts + 1, events,
        )
        c = row.config
        timeout = self.engine.settings.timeout_s
        if self.kind == "copy":
            await copies.send(batch, c["target"], self.engine.copying)
        elif self.kind == "webhook":
            await webhooks.send(batch, self.engine.http, c["url"], row.secret, timeout, clock=self.engine.clock)
        elif self.kind == "call":
            function = self.engine.receiver(c["function"])
            async with asyncio.timeout(timeout):
                await function(batch.to_dict())
        else:
            assert checkpoint is not None
            definition = processors.lookup(self.engine.processors, c["processor"])
            async with asyncio.timeout(timeout):
                checkpoint = await processors.fold(
                    batch, c["processor"], definition, checkpoint,
                    open_stream=self.engine.open_stream, application=self.engine.application,
                )
        return checkpoint

    async def _processor_checkpoint(self) -> Checkpoint:
        row = self.row
        definition = processors.lookup(self.engine.processors, row.config["processor"])
        cp = self._checkpoint
        if cp is None:
            cp = await self.engine.store().subscriptions.checkpoint(row.tenant, row.path, row.name)
        if (
            not processors.current(cp, definition, row.source_stream_id, row.generation)
            or not cp.complete or cp.through > row.cursor
        ):
            cp = await processors.rebuild(
                self.engine.store(), self.engine.evaluations, definition, row.tenant, row.path, row.name,
                row.source_stream_id, row.generation, row.cursor, self.filter, cp, clock=self.engine.clock,
            )
        self._checkpoint = cp
        return cp

    # --- outcomes --------------------------------------------------------------------

    async def _ack(self, through: int, delivered: int, checkpoint: Checkpoint | None) -> bool:
        r = self.row
        isolating = self.failing is not None and through < self.failing
        row = await self.engine.store().subscriptions.ack(
            r.tenant, r.path, r.name, r.generation, through, delivered, wall_ms(self.engine.clock), checkpoint,
            keep_attempts=isolating, stream_id=r.source_stream_id,
        )
        if row is None:  # a newer generation (or removed): this acknowledgement is void
            self.dirty = True
            return False
        self.row = row
        if checkpoint is not None:
            self._checkpoint = checkpoint
        self.delivered += delivered
        if not isolating:
            self.failing = None
        self.lag = max(self._head - row.cursor, 0)
        self.engine.progressed()
        return True

    async def _failed(self, first: int, last: int, exc: BaseException) -> None:
        """Offsets ``first``..``last`` (one batch) failed: the retry ladder,
        a skip or a halt."""
        row = self.row
        self.failures += 1
        self.failing = last  # the culprit is in the batch: isolate through it
        self._checkpoint = None  # a failed fold may have been half applied in memory
        attempts = row.attempts + 1
        error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        log.info("subscription %s %s: attempt %d failed at %d: %s", row.path, row.name, attempts, first, error)
        version = self.engine.version
        if row.config.get("on_failing_event") == "skip" and attempts >= SKIP_AFTER and first == last:
            if row.skips + 1 >= SKIPS_IN_A_ROW:
                await self._apply(decide_halt(row.name, row.generation, first, attempts, error, version))
            else:
                await self._apply(decide_skip(row.name, row.generation, first, attempts, error))
            return
        if attempts >= MAX_ATTEMPTS:
            await self._apply(decide_halt(row.name, row.generation, first, attempts, error, version))
            return
        settings = self.engine.settings
        delay = getattr(exc, "retry_after_s", None)
        if delay is None:
            delay = backoff_s(attempts, settings.retry_base_s, settings.retry_max_s, row.tenant, row.path, row.name, first)
        failed = await self.engine.store().subscriptions.fail(
            row.tenant, row.path, row.name, row.generation, attempts, error,
            wall_ms(self.engine.clock) + int(delay * 1000),
            stream_id=row.source_stream_id,
        )
        if failed is None:
            self.dirty = True
        else:
            self.row = failed

    async def crashed(self, exc: BaseException) -> None:
        """The runner itself failed (not the receiver): count it as a failed
        attempt at the next event."""
        await self._reload()
        nxt = self.row.cursor + 1
        await self._failed(nxt, nxt, exc)

    async def _apply(self, decide: Any) -> None:
        changed = await self.engine.control(self.row, decide)
        if changed is None:
            self.dirty = True
        else:
            self.row = changed

