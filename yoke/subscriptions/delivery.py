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
import logging
import random
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors, metrics
from ..events import Event, now_ms
from ..lifecycle import is_lifecycle
from ..routing.filters import Filter, evaluate
from ..store.subscriptions import Checkpoint, SubscriptionRow
from . import copy, processors, webhooks
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
from .receivers import MAX_BATCH_BYTES, MAX_BATCH_EVENTS

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .engine import Deliveries

log = logging.getLogger("yoke.subscriptions")

READ_PAGE = 1000
MAX_ATTEMPTS = 15  # failed attempts before a halt
SKIP_AFTER = 3  # attempts before on_failing_event="skip" skips the event
SKIPS_IN_A_ROW = 3  # the third consecutive failing event halts instead of being skipped
STEP_BUDGET_S = 0.05  # one-event receivers: acknowledge at least this often
RUN_ENDING = frozenset({CONFIGURED, CURSOR_SET, REMOVED})


@dataclass(frozen=True)
class Batch:
    runtime: Runtime
    tenant: str
    path: str
    name: str
    stream_id: str
    created_at: int
    generation: int
    attempt: int
    events: list[Event]

    @property
    def delivery_id(self) -> str:
        return f"{self.stream_id}:{self.generation}:{self.events[0].offset}-{self.events[-1].offset}"

    def lifetime(self) -> dict[str, Any]:
        """The run that produced the batch, for a receiver to fence a
        superseded one (seed 003, "The receiver's passive fence"): the source
        stream's lifetime (``stream_id``, ``stream_created_at``) and the
        configuration generation (the configure or cursor_set offset)."""
        return {"stream_id": self.stream_id, "stream_created_at": self.created_at, "generation": self.generation}

    def to_dict(self) -> dict[str, Any]:
        """What a ``call`` receiver gets."""
        return {
            "events": [e.to_dict() for e in self.events], "path": self.path, "name": self.name,
            **self.lifetime(), "attempt": self.attempt, "delivery_id": self.delivery_id,
        }


def backoff_s(attempts: int, base_s: float, max_s: float) -> float:
    """1 s, 2 s, 4 s ... (from ``base_s``) up to ``max_s``, +-20% jitter."""
    return min(base_s * 2 ** (attempts - 1), max_s) * random.uniform(0.8, 1.2)


def transformed(event: Event, doc: dict[str, Any], expression: str) -> Event:
    """The event (``doc``: as a document) reshaped by a transform: ``{type?,
    payload?, metadata?}`` replace those fields; coordinates and provenance
    stay the source's."""
    shaped = evaluate(expression, doc, "transform")
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


class Runner:
    def __init__(self, engine: Deliveries, row: SubscriptionRow) -> None:
        self.engine = engine
        self.runtime = engine.runtime
        self.row = row
        self.lease_until = row.lease_until
        self.dirty = False
        # After a failure, batches of one event until the event that failed
        # is through (and its attempts count on until then).
        self.failing: int | None = row.cursor + 1 if row.attempts > 0 else None
        self._poke = asyncio.Event()
        self._checkpoint: Checkpoint | None = None
        self._created_at: int | None = None  # the source's, for stamps and hops
        self._head = 0  # the source's head at the last read
        self._configure(row)

    def _configure(self, row: SubscriptionRow) -> None:
        c = row.config
        self.kind = c["kind"]
        self.filter = Filter.from_dict(c["filter"]) if c.get("filter") else None
        self.transform = c.get("transform")
        self.batch_events = MAX_BATCH_EVENTS if self.kind in ("copy", "call") else 1
        self._checkpoint = None
        labels = (row.tenant, row.path, row.name)
        self._delivered = metrics.child(metrics.SUB_DELIVERED, *labels)
        self._failures = metrics.child(metrics.SUB_FAILURES, *labels)
        self._lag = metrics.child(metrics.SUB_LAG, *labels)
        self._halted = metrics.child(metrics.SUB_HALTED, *labels)

    def update(self, row: SubscriptionRow) -> None:
        """A fresher row from the engine's claim (renewed lease; maybe an
        operator change made in another process)."""
        self.lease_until = row.lease_until
        if (row.generation, row.halted, row.config) != (self.row.generation, self.row.halted, self.row.config):
            self.dirty = True
        self.poke()

    def poke(self) -> None:
        self._poke.set()

    # --- the loop --------------------------------------------------------------

    async def run(self) -> None:
        r = self.row
        waiter = self.runtime.hub.subscribe(r.tenant, r.path)
        try:
            while True:
                if self.dirty and not await self._reload():
                    return
                row = self.row
                if row.halted is not None:
                    if not await self._resume_on_new_version():
                        self._halted.set(1)
                        return
                    continue
                self._halted.set(0)
                if time.time() * 1000 >= self.lease_until:
                    return  # the lease ran out: whoever holds it now resumes from the cursor
                wait_ms = row.next_retry_at - now_ms()
                if wait_ms > 0:
                    await self._wait(None, wait_ms / 1000)
                    continue
                if not await self.step():
                    await self._wait(waiter, self.engine.sweep_s)
        finally:
            waiter.close()

    async def _wait(self, waiter: Any, timeout_s: float) -> None:
        waits = [asyncio.ensure_future(self._poke.wait())]
        if waiter is not None:
            waits.append(asyncio.ensure_future(waiter.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self._poke.clear()

    async def _reload(self) -> bool:
        r = self.row
        row = await self.runtime.store.subscriptions.get(r.tenant, r.path, r.name)
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
        store = self.runtime.store
        page = await store.read(row.tenant, row.path, row.cursor, READ_PAGE)
        if page.stream_id != row.source_stream_id:
            # The source was deleted (and maybe created again): this
            # subscription belonged to its old lifetime and never delivers again.
            self.dirty = True
            return True
        self._created_at = page.created_at
        self._head = page.head
        self._lag.set(max(page.head - row.cursor, 0))
        if not page.events:
            if page.head > row.cursor:  # only ephemeral (or pruned) offsets follow
                await self._ack(page.head, 0, None)
                return True
            return False
        chosen, through, broken = self._select(page.events, page.head)
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
            started = time.monotonic()
            size = self.batch_events if self.failing is None else 1
            for start in range(0, len(chosen), size):
                group = chosen[start : start + size]
                if delivered and time.monotonic() - started > STEP_BUDGET_S:
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

    def _select(
        self, events: list[Event], head: int
    ) -> tuple[list[Event], int, tuple[Event, BaseException] | None]:
        """The events to send (transformed), the offset the step covers, and
        the first event whose filter or transform failed (when nothing precedes it)."""
        chosen: list[Event] = []
        size = 0
        through = self.row.cursor
        limit = 1 if self.failing is not None else (MAX_BATCH_EVENTS if self.batch_events > 1 else READ_PAGE)
        for event in events:
            if self._ends_run(event):
                break  # an operator change of this subscription: reread the row first
            # The event as a document, made once for filter, transform and size.
            doc = event.to_dict() if self.filter or self.transform or self.batch_events > 1 else None
            try:
                keep = self._matches(event, doc)
                out = transformed(event, doc, self.transform) if keep and self.transform else event
            except Exception as exc:
                if chosen or through > self.row.cursor:
                    return chosen, through, None  # deliver the prefix first
                return [], through, (event, exc)
            if keep:
                if self.batch_events > 1:
                    weight = len(orjson.dumps(doc if out is event else out.to_dict()))
                else:
                    weight = 0
                if len(chosen) >= limit or (chosen and size + weight > MAX_BATCH_BYTES):
                    return chosen, through, None
                chosen.append(out)
                size += weight
            through = event.offset
        else:
            if len(events) < READ_PAGE:
                through = max(through, head)  # trailing ephemeral offsets
        return chosen, through, None

    def _ends_run(self, event: Event) -> bool:
        """Is ``event`` this subscription's own configure, cursor move or
        removal, newer than the run being delivered? Then the run ends there."""
        return (
            event.type in RUN_ENDING and event.offset > self.row.generation and first_hand(event)
            and isinstance(event.payload, dict) and event.payload.get("name") == self.row.name
        )

    def _matches(self, event: Event, doc: dict[str, Any] | None) -> bool:
        if self.kind == "copy" and (event.type == AUDIT or is_lifecycle(event.type)):
            return False  # audit lines and lifecycle facts are local, never copied onward
        return self.filter is None or self.filter.matches(doc)

    async def _send(self, events: list[Event], checkpoint: Checkpoint | None) -> Checkpoint | None:
        row = self.row
        batch = Batch(
            self.runtime, row.tenant, row.path, row.name, row.source_stream_id,
            self._created_at or 0, row.generation, row.attempts + 1, events,
        )
        c = row.config
        timeout = self.runtime.settings.subscription_timeout_s
        if self.kind == "copy":
            await copy.send(batch, c["target"])
        elif self.kind == "webhook":
            await webhooks.send(batch, self.engine.http, c["url"], row.secret, timeout)
        elif self.kind == "call":
            function = self.engine.receiver(c["function"])
            async with asyncio.timeout(timeout):
                await function(batch.to_dict())
        else:
            assert checkpoint is not None
            definition = processors.lookup(self.runtime, c["processor"])
            async with asyncio.timeout(timeout):
                checkpoint = await processors.fold(batch, c["processor"], definition, checkpoint)
        return checkpoint

    async def _processor_checkpoint(self) -> Checkpoint:
        row = self.row
        definition = processors.lookup(self.runtime, row.config["processor"])
        cp = self._checkpoint
        if cp is None:
            cp = await self.runtime.store.subscriptions.checkpoint(row.tenant, row.path, row.name)
        if (
            not processors.current(cp, definition, row.source_stream_id, row.generation)
            or not cp.complete or cp.through > row.cursor
        ):
            cp = await processors.rebuild(
                self.runtime, definition, row.tenant, row.path, row.name, row.source_stream_id,
                row.generation, row.cursor, self.filter, cp,
            )
        self._checkpoint = cp
        return cp

    # --- outcomes --------------------------------------------------------------------

    async def _ack(self, through: int, delivered: int, checkpoint: Checkpoint | None) -> bool:
        r = self.row
        isolating = self.failing is not None and through < self.failing
        row = await self.runtime.store.subscriptions.ack(
            r.tenant, r.path, r.name, r.generation, through, delivered, now_ms(), checkpoint,
            keep_attempts=isolating, stream_id=r.source_stream_id,
        )
        if row is None:  # a newer generation (or removed): this acknowledgement is void
            self.dirty = True
            return False
        self.row = row
        if checkpoint is not None:
            self._checkpoint = checkpoint
        if delivered:
            self._delivered.inc(delivered)
        if not isolating:
            self.failing = None
        self._lag.set(max(self._head - row.cursor, 0))
        self.engine.progressed()
        return True

    async def _failed(self, first: int, last: int, exc: BaseException) -> None:
        """Offsets ``first``..``last`` (one batch) failed: the retry ladder,
        a skip or a halt."""
        row = self.row
        self._failures.inc()
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
        settings = self.runtime.settings
        delay = getattr(exc, "retry_after_s", None)
        if delay is None:
            delay = backoff_s(attempts, settings.subscription_retry_base_s, settings.subscription_retry_max_s)
        failed = await self.runtime.store.subscriptions.fail(
            row.tenant, row.path, row.name, row.generation, attempts, error, now_ms() + int(delay * 1000),
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

