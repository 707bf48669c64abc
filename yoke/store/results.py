"""The values the storage contract passes (``contract.Store`` takes and
returns them): streams, events as stored, commit outcomes, pages, consumers,
objects, tokens. Plain data, no behaviour of a backend; both drivers and the
layers above build and read them. ``store.contract`` re-exports them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ..events import Event, PreparedEvent

if TYPE_CHECKING:
    from .durable_streams import GuardOutcome


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: float | None = None
    max_events: int | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """Producer credit ceilings. Unread counts durable events after the
    minimum consumer acknowledgement (only when the stream has consumers);
    total counts every retained durable event."""

    max_unread_events: int | None = None
    max_unread_bytes: int | None = None
    max_total_events: int | None = None
    max_total_bytes: int | None = None
    overflow: Literal["reject", "block"] = "reject"
    block_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Usage:
    """What counts against the limits, from durable rows."""

    durable_events: int = 0
    durable_bytes: int = 0
    unread_events: int = 0
    unread_bytes: int = 0
    min_ack: int | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    stream_id: str
    tenant: str
    path: str
    created_at: int
    head: int  # highest offset ever assigned (ephemeral ones included)
    earliest: int  # lowest offset a read can still return (pruned_through + 1)
    closed: bool
    legal_hold: bool
    retention: Retention = field(default_factory=Retention)
    limits: Limits = field(default_factory=Limits)
    usage: Usage = field(default_factory=Usage)
    pinned: bool = False  # a definition: retention, limits and metadata never change
    metadata: dict[str, Any] = field(default_factory=dict)
    # A workflow definition's data handling pins (streams/data_handling.py), as stored.
    data_handling: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StreamTotals:
    streams: int = 0
    offsets: int = 0  # the sum of the heads


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Everything a stream can be created with."""

    retention: Retention = field(default_factory=Retention)
    limits: Limits = field(default_factory=Limits)
    pinned: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    data_handling: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    consumer_id: str
    acked: int
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    object_id: str
    tenant: str
    path: str
    idempotency_key: str
    sha256: str
    size: int
    content_type: str
    # "expired" is never stored: ``StreamObjects`` reports it for a prepared
    # or uploaded object past ``expires_at`` (the store's rows keep the state
    # they had; commit refuses them in the append transaction).
    state: Literal["prepared", "uploaded", "committed", "aborted", "expired"]
    created_at: int
    expires_at: int
    committed_offset: int | None
    schema: str | None = None  # pinned at prepare: the schema the bytes follow
    authorization: dict[str, Any] | None = None  # the receipt of who prepared it


@dataclass(frozen=True, slots=True)
class TokenInfo:
    token_id: str
    tenant: str
    name: str
    scopes: tuple[str, ...]
    secret_hash: str
    created_at: int
    revoked_at: int | None
    expires_at: int | None = None  # ms; refused from then on (token_expired)

    def to_dict(self) -> dict[str, Any]:
        """What the API and the CLI show of a token (never its hash)."""
        return {
            "token_id": self.token_id,
            "tenant": self.tenant,
            "name": self.name,
            "scopes": list(self.scopes),
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
            "revoked": self.revoked_at is not None,
            "expires_at": self.expires_at,
        }


class Outcome(NamedTuple):
    """What happened to one event of a group commit (a named tuple: a
    commit makes one per event, at a third of a frozen dataclass's cost)."""

    # conflict: key reused for another event; object: the referenced object
    # is not uploaded or has expired (a new record), or is not committed by
    # the record its key found (a duplicate); closed: the stream takes no new
    # event; unread_full / quota: no producer credit.
    status: Literal["ok", "duplicate", "conflict", "object", "closed", "unread_full", "quota", "guarded"]
    offset: int | None
    id: str
    at: int


class Admitted(Sequence[Outcome]):
    """The outcomes of a commit that took every event, at consecutive
    offsets from ``first``: each is made when asked for, on the caller's
    side rather than on the store's writer (an unguarded protocol append
    asks for its last only)."""

    __slots__ = ("first", "events", "at")

    def __init__(self, first: int, events: Sequence[PreparedEvent], at: int) -> None:
        self.first = first
        self.events = events
        self.at = at

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, _, step = index.indices(len(self.events))
            if step != 1:
                return list(self)[index]
            return Admitted(self.first + start, self.events[index], self.at)
        n = len(self.events)
        if not -n <= index < n:
            raise IndexError("outcome index out of range")
        index %= n
        return Outcome("ok", self.first + index, self.events[index].id, self.at)

    def __repr__(self) -> str:
        return f"Admitted(first={self.first}, count={len(self.events)}, at={self.at})"

    def __iter__(self) -> Iterator[Outcome]:
        at = self.at
        return (Outcome("ok", offset, e.id, at) for offset, e in enumerate(self.events, self.first))


@dataclass(frozen=True, slots=True)
class CommitResult:
    outcomes: Sequence[Outcome]  # one per submitted event, in order (Admitted: all taken)
    head: int
    # With guards (store/durable_streams.py): one decision per caller batch; the
    # events of a batch its guard refused have the outcome status "guarded".
    guards: list[GuardOutcome] | None = None


class StoredEvent(NamedTuple):
    """An event as stored, undecoded: what ``read_stored`` returns."""

    offset: int
    type: str
    payload_json: str  # the canonical JSON text the append stored
    data: bytes | None  # a Durable Streams byte message's bytes


@dataclass(frozen=True, slots=True)
class ReadPage:
    exists: bool
    head: int
    pruned_through: int
    events: list[Event]  # read_stored: list[StoredEvent]
    closed: bool = False  # read with head, from the same row version
    # Each event's size in bytes as stored (PreparedEvent.size), in the order
    # of ``events``: what a read's byte cap counts. Filled by ``read``.
    sizes: list[int] = field(default_factory=list)
    # True when the byte cap ended the page before ``limit``: events after
    # its last one remain (a page of ``limit`` events may also be followed
    # by more; a shorter page that is not capped reached the head).
    capped: bool = False
    # The lifetime the page was read from (``StreamInfo.stream_id`` and
    # ``created_at``): a reader that sees it change knows the stream was
    # deleted and created again since its last page.
    stream_id: str = ""
    created_at: int = 0


class PayloadPage(NamedTuple):
    """``read_payloads``'s page: the stream's head and closed flag, read with
    it, the page's last offset (None when no event follows ``after``), and
    the JSON array of its events' payload texts as stored, in offset order,
    as UTF-8 bytes."""

    head: int
    closed: bool
    last: int | None
    body: bytes


@dataclass(frozen=True, slots=True)
class GapEvidence:
    """Events a tail found that no wake-up had announced (streams/gaps.py)."""

    first: int
    last: int
    cause: str  # what made the tail read: "sweep" (its periodic reread) or "resync" (a reconnect)
    detected_at: int
    process: str


MAX_GAPS = 100  # kept per stream, newest first

WakeupCallback = Callable[[str, str], None]  # (tenant, path)
# (tenant, path, offset, at, event): an ephemeral event another process appended
EphemeralCallback = Callable[[str, str, int, int, PreparedEvent], None]

__all__ = [
    "Admitted",
    "CommitResult",
    "ConsumerInfo",
    "EphemeralCallback",
    "GapEvidence",
    "Limits",
    "MAX_GAPS",
    "ObjectInfo",
    "Outcome",
    "PayloadPage",
    "ReadPage",
    "Retention",
    "StoredEvent",
    "StreamInfo",
    "StreamSettings",
    "StreamTotals",
    "TokenInfo",
    "Usage",
    "WakeupCallback",
]
