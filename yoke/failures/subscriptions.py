"""Subscription failures in the inbox: halted subscriptions (with the event
they halted on) and events their skip policy stepped over.

Both are read from what delivery already keeps: a halt is the subscription
row's ``halted`` (with the offset of its ``yoke.subscription.halted``
event); a skip is the ``yoke.error`` audit line (kind
``subscription_event_skipped``) on the source stream, open until a
``yoke.failure.replayed`` or ``yoke.failure.discarded`` event on the same
stream names its id. Every action goes through ``store.subscriptions.control``:
the audit event and the row change commit together, under the source
stream's row lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

import httpx

from .. import errors
from ..clock import wall_ms
from ..events import Event, prepare
from ..routing.filters import Filter
from ..store.subscriptions import Change, Probe, SourceState, SubscriptionRow
from ..subscriptions import copies, webhooks
from ..subscriptions.catalogue import AUDIT, RESUMED
from ..subscriptions.batch import Batch
from ..subscriptions.runner import transform_one
from ..subscriptions.deliveries import control
from ..tracing import ending
from .model import DISCARDED, HALTED, REPLAYED, SKIPPED, Attempt, Failure, kept, make_id, parse_id

if TYPE_CHECKING:
    from .model import FailureServices

SKIP_KIND = "subscription_event_skipped"
SCAN_PAGE = 1000
MAX_SUBSCRIPTIONS = 100_000  # rows one listing looks at
EVENT_FIELDS = frozenset(f.name for f in fields(Event))


def halt_is_failure(halted: dict[str, Any] | None) -> bool:
    """A halt the delivery recorded (an error): a pause or an operator's
    halt is a decision, not a failure."""
    return halted is not None and not halted.get("parked") and halted.get("error") is not None


async def subscription_rows(services: FailureServices, tenant: str) -> list[SubscriptionRow]:
    _, rows = await services.store().subscriptions.totals(tenant, MAX_SUBSCRIPTIONS)
    return rows


async def _event_at(services: FailureServices, tenant: str, path: str, offset: int) -> Event | None:
    page = await services.store().read_one(tenant, path, offset)
    return page.events[0] if page.events else None


async def halted_failure(services: FailureServices, row: SubscriptionRow, *, events: bool = True) -> Failure:
    """``events=False``: without the event (the metrics count them)."""
    h = row.halted or {}
    offset = int(h["offset"])
    at_offset = int(h.get("at_offset") or 0)
    event = await _event_at(services, row.tenant, row.path, offset) if events else None
    attempts_kept = kept(row.attempt_errors)
    if attempts_kept and attempts_kept[-1].at:
        at = attempts_kept[-1].at  # the halting attempt
    else:  # halted before attempts were kept: the time of its halted event
        marker = await _event_at(services, row.tenant, row.path, at_offset) if at_offset else None
        at = marker.at if marker is not None else row.configured_ms
    attempts = int(h.get("attempts") or 0)
    return Failure(
        id=make_id(HALTED, row.path, row.name, at_offset), kind=HALTED, receiver=row.config["kind"],
        path=row.path, offset=offset, failed_at=at, attempt_count=attempts, error=h.get("error"),
        attempts=attempts_kept or [Attempt(attempts, h.get("error"), at)],
        event=None if event is None else event.to_dict(), subscription=row.name,
    )


async def halted_failures(services: FailureServices, rows: list[SubscriptionRow], *, events: bool = True) -> list[Failure]:
    return [
        await halted_failure(services, r, events=events)
        for r in rows if halt_is_failure(r.halted) and r.halted.get("at_offset")
    ]


def _skip_of(event: Event, rows: dict[str, SubscriptionRow]) -> SubscriptionRow | None:
    p = event.payload if isinstance(event.payload, dict) else {}
    if event.type != AUDIT or p.get("kind") != SKIP_KIND or (event.source or {}).get("copied_from"):
        return None
    row = rows.get(p.get("name"))  # type: ignore[arg-type]
    return row if row is not None and event.offset > row.configured_at else None


async def _open_skips(
    services: FailureServices, tenant: str, path: str, named: dict[str, SubscriptionRow], after: int
) -> list[tuple[str, Event, SubscriptionRow]]:
    """(failure id, skip audit line, subscription) of the skips of ``path``
    after ``after`` that no ``yoke.failure.replayed`` or ``discarded`` event
    resolved (the store selects these types; a resolution always follows its
    skip line, so a resolved skip is dropped as the scan meets it)."""
    open_: dict[str, tuple[Event, SubscriptionRow]] = {}
    while True:
        page = await services.store().subscriptions.events_of_types(
            tenant, path, (AUDIT, REPLAYED, DISCARDED), after, SCAN_PAGE
        )
        for e in page:
            if e.type in (REPLAYED, DISCARDED):
                if isinstance(e.payload, dict):
                    open_.pop(e.payload.get("failure"), None)  # type: ignore[arg-type]
                continue
            row = _skip_of(e, named)
            if row is not None:
                open_[make_id(SKIPPED, path, row.name, e.offset)] = (e, row)
        if len(page) < SCAN_PAGE:
            return [(fid, e, row) for fid, (e, row) in open_.items()]
        after = page[-1].offset


async def skipped_failures(
    services: FailureServices, tenant: str, rows: list[SubscriptionRow], *, path: str | None = None,
    from_offset: int | None = None, events: bool = True,
) -> list[Failure]:
    """The open skips of the skip-policy subscriptions among ``rows`` (of
    ``path`` only, and from the audit line at ``from_offset`` on, when given);
    ``events=False``: without their events (``with_event`` reads one)."""
    by_path: dict[str, dict[str, SubscriptionRow]] = {}
    for r in rows:
        if r.config.get("on_failing_event") == "skip" and r.failures and (path is None or r.path == path):
            by_path.setdefault(r.path, {})[r.name] = r
    out: list[Failure] = []
    for source, named in by_path.items():
        start = min(r.configured_at for r in named.values())
        if from_offset is not None:
            start = max(start, from_offset - 1)
        for fid, e, row in await _open_skips(services, tenant, source, named, start):
            p = e.payload
            attempts = int(p.get("attempts") or 0)
            out.append(Failure(
                id=fid, kind=SKIPPED, receiver=row.config["kind"], path=source, offset=int(p["offset"]),
                failed_at=e.at, attempt_count=attempts, error=p.get("error"),
                attempts=kept(p.get("attempt_errors")) or [Attempt(attempts, p.get("error"), e.at)],
                subscription=row.name,
            ))
    if events:
        out = [await with_event(services, tenant, f) for f in out]
    return out


async def with_event(services: FailureServices, tenant: str, failure: Failure) -> Failure:
    """A halted or skipped failure with its event (None once retention removed it)."""
    if failure.event is not None or failure.path is None or failure.offset is None:
        return failure
    event = await _event_at(services, tenant, failure.path, failure.offset)
    return failure if event is None else replace(failure, event=event.to_dict())


async def find(services: FailureServices, tenant: str, kind: str, path: str, name: str, at: int) -> Failure:
    """The open halted or skipped failure with these coordinates."""
    row = await services.store().subscriptions.get(tenant, path, name)
    missing = errors.FailureNotFound(
        f"no open {kind} failure of subscription {name!r} on {path} at {at}", path=path, subscription=name
    )
    if row is None:
        raise missing
    if kind == HALTED:
        if not halt_is_failure(row.halted) or (row.halted or {}).get("at_offset") != at:
            raise missing
        return await halted_failure(services, row)
    found = await skipped_failures(services, tenant, [row], path=path, from_offset=at, events=False)
    for f in found:
        if f.id == make_id(SKIPPED, path, name, at):
            return await with_event(services, tenant, f)
    raise missing


# --- actions ------------------------------------------------------------------------


def audit_event(event_type: str, failure: Failure, **extra: Any) -> Any:
    return prepare({"type": event_type, "payload": {
        "failure": failure.id, "kind": failure.kind, "receiver": failure.receiver,
        "offset": failure.offset, "subscription": failure.subscription, **extra,
    }}, trusted=True)


def _check_halt(row: SubscriptionRow | None, failure: Failure, action: str, advance: bool) -> None:
    """Refuse unless the subscription is still halted on ``failure`` (and,
    when ``advance``, its cursor is right before the halted event)."""
    if row is None or not halt_is_failure(row.halted) or (row.halted or {}).get("at_offset") != parse_at(failure):
        raise errors.FailureNotFound("the subscription is no longer halted on this failure", id=failure.id)
    if advance and row.cursor < (failure.offset or 0) - 1:
        if action == "discard":
            raise errors.FailureNotReplayable(
                f"the cursor ({row.cursor}) is behind the halted event ({failure.offset}): a discard steps"
                f" over that event alone, so first move the cursor to {(failure.offset or 0) - 1}",
                id=failure.id,
            )
        raise errors.FailureNotReplayable(
            f"the cursor ({row.cursor}) is not at the halted event ({failure.offset}):"
            " replay it as it is, or move the cursor", id=failure.id,
        )


def _resolve_halt(failure: Failure, audit: Any, action: str, advance: bool):  # noqa: ANN202 - a Decide
    """Resume the halted subscription (the halt still the one ``failure``
    names), moving its cursor past the halted event when ``advance``."""

    def decide(row: SubscriptionRow | None, source: SourceState) -> Change:
        _check_halt(row, failure, action, advance)
        assert row is not None
        cursor = max(row.cursor, failure.offset or 0) if advance else row.cursor
        new = replace(row, halted=None, attempts=0, skips=0, next_retry_at=0, cursor=cursor, attempt_errors=())
        resumed = prepare({"type": RESUMED, "payload": {"name": row.name, "reason": action}}, trusted=True)
        return Change(events=[resumed, audit], row=new, bookkeeping=True, reply=source.next_offset + 1)

    return decide


def _record_skip(failure: Failure, audit: Any):  # noqa: ANN202 - a Decide
    """Record the skip's resolution, unless one is already recorded (the
    store's probe, read under the stream lock): a skip is resolved once."""

    def decide(row: SubscriptionRow | None, source: SourceState) -> Change:
        if row is None:
            raise errors.FailureNotFound("the subscription is gone", id=failure.id)
        if source.probed:
            raise errors.FailureNotFound("the skipped event was replayed or discarded meanwhile", id=failure.id)
        return Change(events=[audit], bookkeeping=True, reply=source.next_offset)

    return decide


def parse_at(failure: Failure) -> int:
    return int(parse_id(failure.id)[1][2])


async def _act(services: FailureServices, tenant: str, failure: Failure, decide: Any) -> int:
    assert failure.path is not None and failure.subscription is not None
    probe = None
    if failure.kind == SKIPPED:  # a resolution of this skip after its audit line
        probe = Probe((REPLAYED, DISCARDED), parse_at(failure), "failure", failure.id)
    offset = await control(
        services.store, services.appends, tenant, failure.path, failure.subscription, decide,
        now=wall_ms(services.clock), probe=probe,
    )
    services.signals.subscription_changed.emit(tenant, failure.path, failure.subscription)
    return int(offset)


async def replay(
    services: FailureServices, tenant: str, failure: Failure, document: dict[str, Any] | None,
    correction: dict[str, Any] | None,
) -> tuple[int, bool]:
    """(audit offset, delivered now). A halted subscription replayed as it
    is resumes (its runner delivers the event again); with a correction, and
    for a skipped event, the event is delivered here, once, to this
    subscription's receiver alone, and then recorded (the caller holds the
    failure's in-process claim, see ``inbox``; the record refuses a failure
    resolved meanwhile by another process)."""
    extra = {"corrected": correction, "event_id": document["id"]} if correction and document else {}
    audit = audit_event(REPLAYED, failure, **extra)
    if failure.kind == HALTED and correction is None:
        return await _act(services, tenant, failure, _resolve_halt(failure, audit, "replay", False)), False
    if document is None:
        raise errors.FailureNotReplayable(
            "the event is no longer in its stream (retention): discard the failure", id=failure.id
        )
    delivered = await deliver_once(services, tenant, failure, document)
    if failure.kind == HALTED:
        decide = _resolve_halt(failure, audit, "replay", True)
    else:
        decide = _record_skip(failure, audit)
    return await _act(services, tenant, failure, decide), delivered


async def discard(services: FailureServices, tenant: str, failure: Failure, reason: str) -> int:
    audit = audit_event(DISCARDED, failure, reason=reason)
    if failure.kind == HALTED:
        return await _act(services, tenant, failure, _resolve_halt(failure, audit, "discard", True))
    return await _act(services, tenant, failure, _record_skip(failure, audit))


async def deliver_once(services: FailureServices, tenant: str, failure: Failure, document: dict[str, Any]) -> bool:
    """Send one event to the failure's subscription, as its runner would
    (filter, transform, receiver); False when the filter leaves it out."""
    assert failure.path is not None and failure.subscription is not None and failure.offset is not None
    row = await services.store().subscriptions.get(tenant, failure.path, failure.subscription)
    if row is None:
        raise errors.FailureNotFound("the subscription is gone", id=failure.id)
    if failure.kind == HALTED:  # checked before delivering, again when recording
        _check_halt(row, failure, "replay", True)
    c = row.config
    kind = c["kind"]
    if kind == "processor":
        raise errors.FailureNotReplayable(
            "a processor folds its stream in order: replay its halt as it is, or discard the event",
            id=failure.id,
        )
    page = await services.store().read_one(tenant, failure.path, failure.offset)
    if page.stream_id != row.source_stream_id:
        raise errors.FailureNotFound("the source stream was deleted", id=failure.id)
    event = Event(**{k: v for k, v in document.items() if k in EVENT_FIELDS})
    if c.get("filter") and not await services.evaluations.select(tenant, Filter.from_dict(c["filter"]), [event]):
        return False
    out = await transform_one(services.evaluations, tenant, event, c["transform"]) if c.get("transform") else event
    batch = Batch(
        tenant, row.path, row.name, row.source_stream_id, page.created_at, row.generation,
        row.attempts + 1, [out],
    )
    span = None
    if services.tracing.on:
        span = services.tracing.start_delivery(
            tenant=tenant, path=row.path, name=row.name, kind=kind, attempt=batch.attempt,
            generation=row.generation, events=[event], replay=True,
        )
    with ending(span):
        await _send_once(services, failure, c, batch, row.secret)
    return True


async def _send_once(
    services: FailureServices, failure: Failure, c: dict[str, Any], batch: Batch, secret: str | None
) -> None:
    kind = c["kind"]
    timeout = services.subscription_timeout_s
    if kind == "copy":
        await copies.send(batch, c["target"], services.copying)
    elif kind == "webhook":
        http = services.http()
        if http is not None:
            await webhooks.send(batch, http, c["url"], secret, timeout)
        else:
            async with httpx.AsyncClient(timeout=timeout) as client:
                await webhooks.send(batch, client, c["url"], secret, timeout)
    else:
        function = services.receivers.get(c["function"])
        if function is None:
            raise errors.FailureNotReplayable(
                f"this process's application has no receiver function {c['function']!r}", id=failure.id
            )
        try:
            async with asyncio.timeout(timeout):
                await function(batch.to_dict())
        except errors.YokeError:
            raise
        except Exception as exc:  # the application's receiver failed the replay
            raise errors.ReplayFailed(
                f"the receiver failed the replay: {type(exc).__name__}: {exc}"[:2000], id=failure.id
            ) from None
