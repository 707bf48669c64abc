"""Actor dead letters in the inbox: queue rows past their attempts.

A replay puts the row back to pending with its attempts reset (with a
correction, the row's event is replaced by the corrected one, whose
``source.replay_of`` names the original: the stream keeps the original
event); a discard deletes the row. Either is recorded on the stream the
event came from (``/`` for an event sent to the instance directly) in the
transaction that changes the row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..clock import wall_ms
from ..events import new_event_id, prepare
from ..lifecycle import GLOBAL, new_stream_id
from ..store.actors import QueueRow
from ..tracing import REPLAYED_IN
from .model import DEAD_LETTER, DISCARDED, REPLAYED, Attempt, Failure, Selection, corrected, kept, make_id

if TYPE_CHECKING:
    from .model import FailureServices


def failure_of(row: QueueRow) -> Failure:
    at = row.started_at or row.enqueued_at
    return Failure(
        id=make_id(DEAD_LETTER, row.qid), kind=DEAD_LETTER, receiver="actor", path=row.path,
        offset=row.offset, failed_at=at, attempt_count=row.attempts, error=row.last_error,
        attempts=kept(row.attempt_errors) or [Attempt(row.attempts, row.last_error, at)],
        event={k: v for k, v in row.event.items() if k != REPLAYED_IN},  # the trace note is the queue's, not the event's
        actor=row.actor or None,
        instance_id=row.instance_id, traceback=row.last_traceback,
    )


async def dead_failures(services: FailureServices, tenant: str, sel: Selection, limit: int) -> list[Failure]:
    if sel.kind not in (None, DEAD_LETTER) or sel.receiver not in (None, "actor") or sel.subscription:
        return []
    rows = await services.store().actors.dead_letters(
        tenant, instance_id=sel.instance_id, actor=sel.actor, path=sel.stream, since=sel.since,
        until=sel.until, limit=limit,
    )
    return [failure_of(r) for r in rows]


async def find(services: FailureServices, tenant: str, qid: int) -> Failure:
    rows = await services.store().actors.dead_letters(tenant, qid=qid, limit=1)
    if not rows:
        raise errors.FailureNotFound("no such dead letter (replayed, discarded or never dead)", qid=qid)
    return failure_of(rows[0])


def _audit(event_type: str, failure: Failure, **extra: Any) -> Any:
    return prepare({"type": event_type, "payload": {
        "failure": failure.id, "kind": failure.kind, "receiver": failure.receiver, "offset": failure.offset,
        "instance_id": failure.instance_id, "actor": failure.actor, **extra,
    }}, trusted=True)


async def replay(
    services: FailureServices, tenant: str, failure: Failure, qid: int, correction: dict[str, Any] | None,
    replayed_in: str | None = None,
) -> tuple[str, int]:
    """``replayed_in``: the replay's trace context, kept in the row's event
    document for its next attempt's span (``tracing.REPLAYED_IN``)."""
    extra: dict[str, Any] = {}
    event_json = None
    if correction is not None:
        document = corrected(failure.event or {}, correction, failure.id, new_event_id())
        if replayed_in is not None:
            document[REPLAYED_IN] = replayed_in
        event_json = orjson.dumps(document).decode()
        extra = {"corrected": correction, "event_id": document["id"]}
    elif replayed_in is not None and failure.event is not None:
        event_json = orjson.dumps({**failure.event, REPLAYED_IN: replayed_in}).decode()
    done = await _resolve(services, tenant, failure, qid, _audit(REPLAYED, failure, **extra), event_json=event_json)
    services.signals.queue_changed.emit(tenant)
    return done


async def discard(services: FailureServices, tenant: str, failure: Failure, qid: int, reason: str) -> tuple[str, int]:
    return await _resolve(services, tenant, failure, qid, _audit(DISCARDED, failure, reason=reason), drop=True)


async def _resolve(
    services: FailureServices, tenant: str, failure: Failure, qid: int, audit: Any, *, drop: bool = False,
    event_json: str | None = None,
) -> tuple[str, int]:
    """The row change and its audit event on the event's stream, in one transaction."""
    path = failure.path or GLOBAL
    outcome = await services.store().actors.resolve_dead(
        tenant, qid, drop=drop, event_json=event_json, audit=audit, path=path, now=wall_ms(services.clock),
        new_stream_id=new_stream_id(),
    )
    if outcome is None:
        raise errors.FailureNotFound("the dead letter was replayed or discarded meanwhile", id=failure.id)
    services.appends.appended(tenant, path, 1)
    return path, int(outcome.offset or 0)
