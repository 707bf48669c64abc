"""What became of a replay: ``Failures.outcome`` (and ``replay(...,
wait=True)``, HTTP ``?wait=true``, ``yoke failures replay --wait``) waits
for the replayed event to go through or to fail again.

- A dead letter goes back to its instance's queue (the same row): ``done``
  once the row is gone (``process()`` returned), ``failed`` once it is dead
  again (its new error). Retries in between are still ``pending``.
- A halt replayed as it is resumes the subscription: ``done`` once its
  cursor passes the event, ``failed`` as soon as a new error is recorded
  before that (an attempt failed again, or it halted again).
- A skip, and a halt replayed corrected, are delivered in the replay call
  itself: ``done`` at once (a corrected halt's cursor is already past the
  event).

The answers are read from the store, what every process writes: this
process's signals wake the wait early, and it reads again at least every
``POLL_S`` for what other processes do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .. import errors
from . import dead_letters
from .model import DEAD_LETTER, DONE, FAILED, HALTED, PENDING, Failure, ReplayOutcome, Resolution, kept, parse_id
from .subscriptions import halt_is_failure

if TYPE_CHECKING:
    from ..store.actors import QueueRow
    from .model import FailureServices

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 3600.0
POLL_S = 0.1  # what other processes do is seen at least this often
QUEUE_SCAN = 1000  # queue rows of the instance one look reads (by qid), to find the replayed one


def check_timeout(timeout_s: object) -> float:
    if (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
        or not 0 <= timeout_s <= MAX_TIMEOUT_S
    ):
        raise errors.InvalidInput(f"timeout_s must be 0-{MAX_TIMEOUT_S:g} seconds", field="timeout_s")
    return float(timeout_s)


async def wait(services: FailureServices, tenant: str, replayed: Resolution, timeout_s: float) -> ReplayOutcome:
    """Look at the failure ``replayed`` resolved until its event is done or
    failed again, or ``timeout_s`` passed (then ``pending``, saying what is
    still on its way)."""
    if replayed.action != "replayed" or replayed.failure is None:
        raise errors.InvalidInput("only a replay (of this process) has an outcome to wait for", field="resolution")
    look = _looker(services, tenant, replayed.failure, replayed.delivered)
    woken = asyncio.Event()
    signals = services.signals
    unwatch = [
        signals.subscription_progressed.connect(woken.set),
        signals.subscription_changed.connect(lambda *_: woken.set()),
        signals.queue_changed.connect(lambda *_: woken.set()),
    ]
    clock = services.clock
    deadline = clock.monotonic() + timeout_s
    try:
        while True:
            woken.clear()  # before the look: a change meanwhile wakes the next wait
            seen = await look()
            if seen.state != PENDING:
                return seen
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return ReplayOutcome(PENDING, f"after {timeout_s:g} s, {seen.detail}",
                                     seen.error, seen.error_at)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(POLL_S, remaining)):
                    await woken.wait()
    finally:
        for disconnect in unwatch:
            disconnect()


def _looker(
    services: FailureServices, tenant: str, failure: Failure, delivered: bool
) -> Callable[[], Awaitable[ReplayOutcome]]:
    kind, coordinates = parse_id(failure.id)
    if kind == DEAD_LETTER:
        return lambda: _dead_letter(services, tenant, failure, int(coordinates[0]))
    if kind == HALTED:
        return lambda: _halt(services, tenant, failure, int(coordinates[2]))

    async def skipped() -> ReplayOutcome:  # delivered (or filtered out) in the replay call
        if not delivered:
            return ReplayOutcome(DONE, f"{failure.subscription}'s filter leaves offset {failure.offset} out:"
                                       " nothing to deliver")
        return ReplayOutcome(DONE, f"offset {failure.offset} was delivered to {failure.subscription} in the replay")

    return skipped


def _attempt_time(row: QueueRow) -> int | None:
    """When its last kept attempt failed (None: a listing without them)."""
    attempts = kept(row.attempt_errors)
    return attempts[-1].at if attempts else None


async def _dead_letter(services: FailureServices, tenant: str, failure: Failure, qid: int) -> ReplayOutcome:
    store = services.store()
    instance = failure.instance_id or ""
    which = f"queue row {qid} of instance {instance}"
    # One read: every state of the row in one snapshot (ordered by qid).
    rows = await store.actors.queue_rows(tenant, instance, None, QUEUE_SCAN)
    row = next((r for r in rows if r.qid == qid), None)
    if row is None and len(rows) == QUEUE_SCAN and rows[-1].qid < qid:
        # Past the rows one look reads: only a dead row can be told apart.
        dead = await store.actors.dead_letters(tenant, qid=qid, limit=1)
        if not dead:
            return ReplayOutcome(PENDING, f"{which}: more than {QUEUE_SCAN} rows of the instance come before it,"
                                          " so whether it ran is not known")
        row = dead[0]
    if row is None:
        if await store.actors.get_instance(tenant, instance) is None:
            return ReplayOutcome(FAILED, f"instance {instance} was removed, with its queue, before {which} ran")
        return ReplayOutcome(DONE, f"{which} was processed")
    if row.status == "dead":
        # As the inbox shows it again (its attempts, with their times).
        again = dead_letters.failure_of(row) if row.attempt_errors else await _dead(services, tenant, qid, row)
        return ReplayOutcome(FAILED, f"{which} is dead again after {again.attempt_count} attempt(s)",
                             again.error, again.failed_at if not again.attempts else again.attempts[-1].at)
    if row.attempts and row.last_error:
        return ReplayOutcome(PENDING, f"{which} is {row.status}: attempt {row.attempts} failed, it is retried",
                             row.last_error, _attempt_time(row))
    return ReplayOutcome(PENDING, f"{which} is {row.status}")


async def _dead(services: FailureServices, tenant: str, qid: int, row: QueueRow) -> Failure:
    found = await services.store().actors.dead_letters(tenant, qid=qid, limit=1)
    return dead_letters.failure_of(found[0] if found else row)


async def _halt(services: FailureServices, tenant: str, failure: Failure, at_offset: int) -> ReplayOutcome:
    assert failure.path is not None and failure.subscription is not None and failure.offset is not None
    name, offset = failure.subscription, failure.offset
    row = await services.store().subscriptions.get(tenant, failure.path, name)
    if row is None:
        return ReplayOutcome(FAILED, f"subscription {name} of {failure.path} was removed")
    if row.cursor >= offset:
        return ReplayOutcome(DONE, f"{name} processed through {row.cursor}, past the replayed offset {offset}")
    halted = row.halted
    if halt_is_failure(halted) and halted is not None and halted.get("at_offset") != at_offset:
        return ReplayOutcome(
            FAILED, f"{name} halted again at offset {halted.get('offset')} after {halted.get('attempts')} attempt(s)",
            halted.get("error"), row.last_error_at,
        )
    if halted is None and row.attempts:
        # The replay's resume started the attempts again: this one failed since.
        return ReplayOutcome(
            FAILED, f"{name} failed attempt {row.attempts} at offset {row.cursor + 1} (it retries; the replayed"
                    f" offset is {offset})", row.last_error, row.last_error_at,
        )
    where = f"{name} processed through {row.cursor}, the replayed offset is {offset}"
    if halted is not None and halted.get("parked"):
        return ReplayOutcome(PENDING, f"{where}; it is paused")
    if halted is not None:
        return ReplayOutcome(PENDING, f"{where}; it is halted by the operator")
    return ReplayOutcome(PENDING, where)
