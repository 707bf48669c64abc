"""The failures inbox's model: one ``Failure`` shape for every parked
failure, its opaque id, the filter that selects them and the audit events
that record what was done with them.

Kinds (what parked the event, which decides what a replay does):

- ``dead_letter``: an actor queue row past its attempts (receiver ``actor``);
- ``halted``: a subscription halted on an event (its delivery gave up;
  a pause or an operator's halt is not a failure);
- ``skipped``: an event a subscription's skip policy stepped over.

``receiver`` says where the event was going: ``actor``, or the
subscription's kind (``copy``, ``webhook``, ``call``, ``processor``): a
webhook delivery that gave up is a ``halted`` or ``skipped`` failure whose
receiver is ``webhook``.

An id is the kind's prefix and the coordinates that name the failure,
base64url-encoded: stable for as long as the failure is open, and decoded
without a lookup. Callers treat it as opaque.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..clock import SYSTEM, Clock
from ..events import check_int, check_text, prepare
from ..tracing import Tracing

if TYPE_CHECKING:
    import httpx

    from ..actors.forks import Forks
    from ..routing.evaluation import Evaluations
    from ..signals import Signals
    from ..store import OpenStore
    from ..streams.append import AppendService
    from ..subscriptions.copies import Copying

@dataclass(frozen=True, eq=False)
class FailureServices:
    """What the inbox uses: the store, the appender (its audit events' wake-ups),
    the signals (a replayed dead letter is queued; a resolved subscription
    failure changed the subscription), and what delivering an event once
    more takes: the evaluations (filter, transform), a copy's target, the
    application's receiver functions, the running deliveries' webhook client
    (None when this process delivers none), the settings values, and the
    tenants' forks (a dead letter forked at its input)."""

    store: OpenStore
    appends: AppendService
    signals: Signals
    evaluations: Evaluations
    copying: Copying
    receivers: Mapping[str, Callable[[dict[str, Any]], Awaitable[Any]]]
    http: Callable[[], httpx.AsyncClient | None]
    max_event_bytes: int
    subscription_timeout_s: float
    clock: Clock = SYSTEM  # the runtime's: what the resolutions stamp
    tracing: Tracing = Tracing()  # a replay's span, linked to the failure's trace
    # A tenant's forks (actors/forks.py): a dead letter forked at its input.
    forks: Callable[[str], Forks] | None = None


DEAD_LETTER = "dead_letter"
HALTED = "halted"
SKIPPED = "skipped"
KINDS = (DEAD_LETTER, HALTED, SKIPPED)
RECEIVERS = ("actor", "copy", "webhook", "call", "processor")
PREFIX = {DEAD_LETTER: "dl_", HALTED: "ht_", SKIPPED: "sk_"}

# The audit events (lifecycle.PREFIXES makes them local: never copied,
# never matched by '*'), appended to the stream the failure concerns.
REPLAYED = "yoke.failure.replayed"
DISCARDED = "yoke.failure.discarded"
MAX_REASON_CHARS = 1000
MAX_ID_CHARS = 2000
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Attempt:
    """One failed attempt as kept: its number, error and time (ms)."""

    number: int
    error: str | None
    at: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "error": self.error, "at": self.at}


@dataclass(frozen=True)
class Failure:
    id: str
    kind: str
    receiver: str
    path: str | None  # the stream the event is from (None: sent to the instance directly)
    offset: int | None
    failed_at: int  # ms: the last attempt
    attempt_count: int
    error: str | None
    # Every failed attempt, oldest first (the first 50; attempt_count
    # counts them all).
    attempts: list[Attempt] = field(default_factory=list)
    event: dict[str, Any] | None = None
    actor: str | None = None
    instance_id: str | None = None
    subscription: str | None = None
    traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind, "receiver": self.receiver, "path": self.path,
            "offset": self.offset, "failed_at": self.failed_at, "attempt_count": self.attempt_count,
            "error": self.error, "attempts": [a.to_dict() for a in self.attempts], "event": self.event,
            "actor": self.actor, "instance_id": self.instance_id, "subscription": self.subscription,
            "traceback": self.traceback,
        }


DONE = "done"
FAILED = "failed"
PENDING = "pending"


@dataclass(frozen=True)
class ReplayOutcome:
    """What became of a replayed event (``replay(..., wait=True)``, see
    ``outcome.py``): ``done`` (it went through), ``failed`` (a new error
    for it: ``error``, at ``error_at``) or ``pending`` (still on its way
    when the wait ended; ``error`` is a retry's, if one failed meanwhile)."""

    state: str  # done | failed | pending
    detail: str  # one sentence: what happened, or what is still pending (no event data in it)
    error: str | None = None
    error_at: int | None = None  # ms since the epoch

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail, "error": self.error, "error_at": self.error_at}


@dataclass(frozen=True)
class Resolution:
    """What one replay or discard did."""

    id: str
    action: str  # replayed | discarded
    audit_path: str  # the stream that holds the audit event
    audit_offset: int | None
    delivered: bool = False  # a subscription replay: the receiver took the event (False: filtered out)
    # A replay waited for (``replay(..., wait=True)``, ``Failures.outcome``): what became of it.
    outcome: ReplayOutcome | None = None
    # The failure as it was when resolved: what ``Failures.outcome`` follows.
    failure: Failure | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "action": self.action, "audit_path": self.audit_path,
            "audit_offset": self.audit_offset, "delivered": self.delivered,
        }
        if self.outcome is not None:
            d["outcome"] = self.outcome.to_dict()
        return d


@dataclass(frozen=True)
class Bulk:
    """What a replay or discard by filter did: the failures resolved and
    those that could not be (with their error)."""

    done: list[Resolution]
    failed: list[tuple[str, errors.YokeError]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "done": [r.to_dict() for r in self.done],
            "failed": [{"id": i, "error": e.to_dict()} for i, e in self.failed],
        }


@dataclass(frozen=True)
class Selection:
    """Which failures a list or a bulk action covers (every field optional;
    ``since`` <= failed_at < ``until``, in ms)."""

    kind: str | None = None
    receiver: str | None = None
    stream: str | None = None
    actor: str | None = None
    instance_id: str | None = None
    subscription: str | None = None
    since: int | None = None
    until: int | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise errors.InvalidInput(f"kind is one of {', '.join(KINDS)}", field="kind")
        if self.receiver is not None and self.receiver not in RECEIVERS:
            raise errors.InvalidInput(f"receiver is one of {', '.join(RECEIVERS)}", field="receiver")
        for name in ("stream", "actor", "instance_id", "subscription"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= 1000):
                raise errors.InvalidInput(f"{name} must be 1-1000 characters", field=name)
            if value is not None:
                check_text(value, name, errors.InvalidInput)
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:  # compared in the stores' SQL: inside their signed 64 bits
                check_int(value, name, 0, what="a time in ms since the epoch")

    def wants(self, failure: Failure) -> bool:
        return (
            (self.kind is None or failure.kind == self.kind)
            and (self.receiver is None or failure.receiver == self.receiver)
            and (self.stream is None or failure.path == self.stream)
            and (self.actor is None or failure.actor == self.actor)
            and (self.instance_id is None or failure.instance_id == self.instance_id)
            and (self.subscription is None or failure.subscription == self.subscription)
            and (self.since is None or failure.failed_at >= self.since)
            and (self.until is None or failure.failed_at < self.until)
        )


def kept(attempt_errors: Any) -> list[Attempt]:
    """The attempts a queue row, subscription or skip audit line kept
    (``[{number, at, error}]``), oldest first."""
    if not isinstance(attempt_errors, (list, tuple)):
        return []
    return [
        Attempt(int(a.get("number") or 0), a.get("error"), a.get("at"))
        for a in attempt_errors if isinstance(a, dict)
    ]


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInput(f"limit must be 1-{MAX_LIMIT}", field="limit")
    return limit


def check_reason(reason: Any) -> str:
    if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_REASON_CHARS:
        raise errors.InvalidInput(f"a reason is 1-{MAX_REASON_CHARS} characters", field="reason")
    return check_text(reason, "reason", errors.InvalidInput)


# --- ids ------------------------------------------------------------------------


def make_id(kind: str, *coordinates: Any) -> str:
    raw = orjson.dumps(list(coordinates))
    return PREFIX[kind] + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_id(failure_id: Any) -> tuple[str, list[Any]]:
    """(kind, coordinates) of an id; ``FailureNotFound`` for anything that
    is not one (no id names nothing by accident)."""
    if not isinstance(failure_id, str) or not 4 <= len(failure_id) <= MAX_ID_CHARS:
        raise errors.FailureNotFound("not a failure id", id=str(failure_id)[:80])
    for kind, prefix in PREFIX.items():
        if failure_id.startswith(prefix):
            body = failure_id[len(prefix):]
            try:
                coordinates = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            except (binascii.Error, ValueError):
                break
            if _shaped(kind, coordinates):
                return kind, coordinates
            break
    raise errors.FailureNotFound("not a failure id", id=failure_id[:80])


def _shaped(kind: str, c: Any) -> bool:
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**63

    def text(v: Any) -> bool:
        # What a path or a subscription name can be: text both stores hold.
        # Other text names no failure, on either backend (PostgreSQL would
        # refuse the lookup, not miss).
        try:
            return isinstance(v, str) and check_text(v, "id", errors.InvalidInput) is v
        except errors.InvalidInput:
            return False

    if not isinstance(c, list):
        return False
    if kind == DEAD_LETTER:
        return len(c) == 1 and whole(c[0])
    return len(c) == 3 and text(c[0]) and text(c[1]) and whole(c[2])


# --- corrected events -------------------------------------------------------------


def check_correction(correction: Any, max_event_bytes: int) -> dict[str, Any]:
    """A corrected event: ``{type?, payload?, metadata?}`` replacing those
    fields of the original (what is not given stays the original's),
    validated like an appended event (no reserved ``yoke.`` types)."""
    if not isinstance(correction, dict) or not correction:
        raise errors.InvalidInput("a corrected event is an object with type, payload or metadata", field="event")
    extra = set(correction) - {"type", "payload", "metadata"}
    if extra:
        raise errors.InvalidInput(
            f"a corrected event sets type, payload or metadata, not {', '.join(sorted(extra))}", field="event"
        )
    if "metadata" in correction and not isinstance(correction["metadata"], dict):
        raise errors.InvalidInput("a corrected event's metadata is an object", field="metadata")
    probe = {"type": correction.get("type", "x"), "payload": correction.get("payload"),
             "metadata": correction.get("metadata", {})}
    prepare(probe, max_event_bytes=max_event_bytes)  # the same rules as an append
    return dict(correction)


def check_one_correction(event: Any, patch: Any) -> None:
    if event is not None and patch is not None:
        raise errors.InvalidInput("a replay takes a corrected event or a patch, not both", field="patch")


def check_patch(patch: Any) -> dict[str, Any]:
    """A patch of the failed event: a JSON Merge Patch (RFC 7386) of its
    ``type``, ``payload`` and ``metadata`` (``{"payload": {"amount": 12}}``
    changes one payload field and keeps the others; ``null`` removes one).
    What it makes of each event is validated when applied (``patched``)."""
    if not isinstance(patch, dict) or not patch:
        raise errors.InvalidInput("a patch is an object with type, payload or metadata", field="patch")
    extra = set(patch) - {"type", "payload", "metadata"}
    if extra:
        raise errors.InvalidInput(f"a patch changes type, payload or metadata, not {', '.join(sorted(extra))}",
                                  field="patch")
    if not isinstance(patch.get("metadata", {}), (dict, type(None))):
        raise errors.InvalidInput("a patch's metadata is an object (or null: none)", field="metadata")
    return dict(patch)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: an object patch merges into an object target, member by
    member (``null`` removes the member); anything else replaces the target."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def patched(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The correction ``patch`` makes of the ``original`` event: each field
    it names, merged (metadata removed whole is ``{}``)."""
    correction = {field: merge_patch(original.get(field), change) for field, change in patch.items()}
    if "metadata" in correction and correction["metadata"] is None:
        correction["metadata"] = {}
    return correction


def corrected(original: dict[str, Any], correction: dict[str, Any] | None, failure_id: str,
              new_id: str) -> dict[str, Any]:
    """The event a replay delivers: the original document, or (with a
    correction) a new event (its own id) whose ``source.replay_of`` points
    at the original. The original stays in its stream, untouched."""
    if correction is None:
        return original
    source = dict(original.get("source") or {})
    source["replay_of"] = {
        "failure": failure_id, "id": original.get("id"), "path": original.get("path"),
        "offset": original.get("offset"),
    }
    return {**original, **correction, "id": new_id, "source": source}
