"""The storage contract: what every backend provides to the layers above.

Both backends (``store.sqlite`` and ``store.postgres``) implement ``Store``
and pass the same contract suite (``tests/contract``). Nothing outside
``yoke/store`` writes SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from ..events import Event, PreparedEvent

if TYPE_CHECKING:
    from .actors import ActorStore
    from .outbox import OutboxStore
    from .protocol import Guard, GuardOutcome, ProtocolStore
    from .subscriptions import SubscriptionStore


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
    # A workflow definition's data handling pins (streams/pins.py), as stored.
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
    # With guards (store/protocol.py): one decision per caller batch; the
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


class Store(Protocol):
    """One backend. All methods are coroutines safe to call concurrently."""

    actors: ActorStore  # the actor tables (store/actors.py)
    subscriptions: SubscriptionStore  # subscriptions, fences, checkpoints (store/subscriptions.py)
    protocol: ProtocolStore  # the Durable Streams settings and producers (store/protocol.py)
    outbox: OutboxStore  # input records' delivery outbox (store/outbox.py)

    # Whether ephemeral events travel between processes (PostgreSQL): then
    # ``commit`` relays them and ``on_ephemeral`` receives other processes'.
    relays_ephemeral: bool

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None,
    ) -> None:
        """Open connections and apply migrations. ``on_wakeup`` receives
        appends made by other processes; ``on_resync`` is called when
        notifications may have been missed (a reconnect); ``on_ephemeral``
        the ephemeral events other processes append, in commit order."""

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        """Return once every ephemeral event committed before the call has
        reached ``on_ephemeral`` (True), or when that cannot be known: a
        lost connection dropped some, or ``timeout_s`` passed (False)."""

    async def close(self) -> None: ...

    async def ready(self) -> None:
        """Raise unless the database answers and every migration is applied."""

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        guards: Sequence[Guard | None] | None = None,
    ) -> CommitResult:
        """One transaction: create the stream if missing, lock its row, resolve
        idempotency keys (a batch with a conflicting key is rejected whole),
        assign offsets head+1.. to the accepted new events in order, insert
        the durable ones, raise the head. ``batch_of[i]`` is the caller batch
        event ``i`` belongs to.

        ``guards`` (one per caller batch, or None): the stream must exist;
        each batch's guard is decided first, in order (``GuardBook``), and
        a refused batch writes nothing; producer state, Stream-Seq and a
        close are written in the same transaction."""

    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        """Durable events with offset > after, ascending, and the stream's
        head and pruned_through from the same snapshot. At most ``limit``
        events and, when ``max_bytes`` is given, at most that many bytes of
        them by their stored sizes (but always the first event, whatever its
        size); a page the byte cap cut short says so (``capped``). Rows past
        the cap are not decoded (at most one is fetched, to know)."""

    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        """``read``, with each event as a ``StoredEvent``: its offset, type,
        payload JSON text as stored and bytes, nothing decoded (the Durable
        Streams protocol serves the stored text as it is)."""

    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        """The page ``read_stored`` would return, as the JSON array of its
        events' payload texts, joined by the database (no event is decoded,
        nor made an object): when the stream exists and each of those events
        has type ``type`` and no bytes, and together they fit ``max_bytes``.
        None otherwise: the caller reads with ``read_stored``. (A Durable
        Streams read of a JSON stream written through the protocol.)"""

    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage: ...

    async def info(self, tenant: str, path: str) -> StreamInfo | None: ...

    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]: ...

    async def stream_totals(self, tenant: str) -> StreamTotals:
        """How many streams the tenant has, and the sum of their heads (every
        offset ever assigned: a rate of appends from two readings)."""

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        """Create the stream if missing; returns (info, created)."""

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        """Append one lifecycle fact (yoke/lifecycle.py) to the tenant's
        global stream ``/``, as kernel bookkeeping: a closed or full ``/``
        still takes it. Stream and instance facts are appended by the store
        itself, in the transaction of their change (``closed`` included:
        ``update_stream`` records ``yoke.stream.closed`` when it closes)."""

    async def update_stream(
        self,
        tenant: str,
        path: str,
        *,
        closed: bool | None = None,
        legal_hold: bool | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
    ) -> StreamInfo | None:
        """Change settings; None when the stream does not exist. Retention
        and limits of a pinned stream raise ``StreamPinned``."""

    async def delete_stream(self, tenant: str, path: str) -> StreamInfo | None:
        """One transaction: remove the stream row and everything keyed by it
        (events, consumers, objects and their bytes, the fan-out cursor, the
        subscriptions it is the source of and their processor checkpoints,
        the passive-fence records it keeps as a receiver), NOTIFY its
        readers; returns the deleted stream as it was, None when missing.
        A stream under legal hold raises ``LegalHold``, nothing removed. The
        path can then be created again, with a new ``stream_id``."""

    async def prune(self, now: int) -> int:
        """One retention pass over every tenant; returns events removed."""

    # --- consumers -----------------------------------------------------------

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        """Advance (or create) a consumer under the stream row lock, keeping
        the unread counters exact. Raises ``StreamNotFound``, ``InvalidAck``
        (beyond the head) or ``AckRegression``."""

    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]: ...

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool: ...

    # --- large objects ------------------------------------------------------

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        """Record an intent; the same idempotency key returns the existing one.
        A closed stream takes no new intent (``StreamClosed``); a retry that
        finds its object still gets it."""

    async def upload_object(
        self, tenant: str, path: str, object_id: str, data: bytes
    ) -> ObjectInfo:
        """Store the bytes of a prepared object (they must match its size and
        digest) and mark it uploaded. Raises ``ObjectNotFound``/``ObjectMismatch``,
        ``StreamClosed`` on a closed stream unless the object is committed."""

    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None: ...

    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        """The bytes of a committed object; None when it is missing or not committed."""

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None: ...

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        """Keep evidence of a repaired live gap (the newest ``MAX_GAPS`` per stream)."""

    async def gaps(self, tenant: str, path: str, limit: int) -> list[GapEvidence]:
        """The stream's gap evidence, newest first."""

    async def pending_deletions(self) -> int:
        """Object bytes queued for deletion, not deleted yet: the deletion
        outbox (SQLite, whose object bytes are files; PostgreSQL keeps them
        in the object's row, deleted in the same transaction: always 0)."""

    async def cleanup_objects(self, now: int) -> int:
        """Remove aborted and expired uncommitted objects (not under legal hold)."""

    # --- tokens --------------------------------------------------------------

    async def create_token(self, token: TokenInfo) -> None: ...

    async def find_token(self, token_id: str) -> TokenInfo | None: ...

    async def list_tokens(self, tenant: str) -> list[TokenInfo]: ...

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool: ...
