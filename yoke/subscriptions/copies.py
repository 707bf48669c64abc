"""The copy receiver: append each delivered event to another stream.

A copy keeps the event's type, payload, metadata, correlation, priority and
group, and lists every hop it travelled in ``source.copied_from`` (oldest
first). Its idempotency key is derived from the source lifetime, path,
subscription name, offset and the generation (configure-or-cursor event), so
a retried batch is a no-op and a deliberate replay after a cursor move copies
again. The receiving stream's passive fence (``store.append_copies``) refuses
batches stamped older than the last one it committed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import errors
from ..clock import SYSTEM, Clock, wall_ms
from ..events import Event, PreparedEvent, prepare
from ..store import OpenStore
from ..store.subscriptions import Stamp
from ..streams.append import AppendService, new_stream_id, refusal_error
from ..streams.rules import APPEND, Admission
from ..tracing import stamp_current
from .catalogue import AUDIT

if TYPE_CHECKING:
    from .batch import Batch


class Admits(Protocol):
    """A stream handle, as far as a copy asks it: may the application append?"""

    def admission(self, action: str) -> Awaitable[Admission]: ...


OpenStream = Callable[[str, str], Admits]  # (path, tenant) -> the handle, as the application


@dataclass(frozen=True, eq=False)
class Copying:
    """What a copy needs: the store, the appender (its wake-ups), the target
    stream's rules, the event size limit and the clock (the copies' created_at)."""

    store: OpenStore
    appends: AppendService
    open_stream: OpenStream
    max_event_bytes: int
    clock: Clock = SYSTEM

MAX_HOPS = 32
# Room for the provenance a copy adds to its event (32 hops of ~300 bytes),
# so an event at the size limit can still be copied.
PROVENANCE_BYTES = 16 * 1024


class Fenced(errors.YokeError):
    """The receiving stream has committed copies from a newer run of this subscription."""

    code = "fenced"
    http_status = 409


def copy_key(batch: Batch, offset: int) -> str:
    raw = f"{batch.stream_id}|{batch.path}|{batch.name}|{offset}|{batch.generation}"
    return "yoke:copy:" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def hop(batch: Batch, event: Event) -> dict[str, Any]:
    return {
        "stream_id": batch.stream_id, "created_at": batch.created_at, "path": batch.path,
        "name": batch.name, "offset": event.offset, "type": event.type, "at": event.at,
        "generation": batch.generation,
    }


def _chain(event: Event) -> list[dict[str, Any]]:
    chain = (event.source or {}).get("copied_from")
    return list(chain) if isinstance(chain, list) else []


def build(batch: Batch, target: str, max_event_bytes: int) -> list[PreparedEvent]:
    """The copies of a batch, with one audit line per dropped event."""
    limit = max_event_bytes + PROVENANCE_BYTES
    out: list[PreparedEvent] = []
    for event in batch.events:
        chain = _chain(event)
        key = copy_key(batch, event.offset)
        if any(isinstance(h, dict) and h.get("path") == target for h in chain) or len(chain) >= MAX_HOPS:
            reason = "cycle" if len(chain) < MAX_HOPS else "hop_limit"
            out.append(prepare({
                "type": AUDIT,
                "payload": {
                    "kind": "copy_dropped", "reason": reason, "source_path": batch.path,
                    "name": batch.name, "offset": event.offset, "type": event.type,
                    "hops": len(chain),
                },
                "idempotency_key": key,
            }, trusted=True))
            continue
        out.append(prepare({
            "type": event.type,
            "payload": event.payload,
            "metadata": event.metadata,
            "source": {**(event.source or {}), "copied_from": [*chain, hop(batch, event)]},
            "correlation": event.correlation,
            "priority": event.priority,
            "group_id": event.group_id,
            "idempotency_key": key,
        }, trusted=True, max_event_bytes=limit))
    return out


async def send(batch: Batch, target: str, via: Copying) -> None:
    copies = build(batch, target, via.max_event_bytes)
    stamp_current(copies)  # a copy carries its delivery's trace context, not its original's
    # The target's rules, as for any append by the application (content
    # classes; an input stream refuses copies). A refusal fails the delivery.
    (await via.open_stream(target, batch.tenant).admission(APPEND)).check_prepared(copies, "a copy")
    stamp = Stamp(batch.path, batch.name, batch.stream_id, batch.created_at, batch.generation)
    result = await via.store().subscriptions.append_copies(
        batch.tenant, target, copies, stamp, wall_ms(via.clock), new_stream_id()
    )
    if result is None:
        raise Fenced(f"{target} holds copies from a newer run of {batch.path} {batch.name!r}")
    refused = next((o for o in result.outcomes if o.status not in ("ok", "duplicate")), None)
    if refused is not None:
        raise refusal_error(refused.status, target, copies)
    fresh = sum(1 for o in result.outcomes if o.status == "ok")
    if fresh:
        via.appends.appended(batch.tenant, target, fresh)
