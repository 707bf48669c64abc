"""The storage contract: what every backend provides to the layers above.

Both backends (``store.sqlite`` and ``store.postgres``) implement ``Store``
and pass the same contract suite (``tests/contract``). Nothing outside
``yoke/store`` writes SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..events import PreparedEvent

# The values the contract passes live in results.py; importing them from
# here keeps working.
from .results import (
    Admitted,
    CommitResult,
    ConsumerInfo,
    EphemeralCallback,
    GapEvidence,
    Limits,
    MAX_GAPS,
    ObjectInfo,
    Outcome,
    PayloadPage,
    ReadPage,
    Retention,
    StoredEvent,
    StreamInfo,
    StreamSettings,
    StreamTotals,
    TokenInfo,
    Usage,
    WakeupCallback,
)

if TYPE_CHECKING:
    from .actors import ActorStore
    from .catalogue import CatalogueStore
    from .forks import ForkStore
    from .inputs import InputStore
    from .durable_streams import Guard, GuardOutcome, ProtocolStore
    from .outbox import OutboxStore
    from .subscriptions import SubscriptionStore


class Store(Protocol):
    """One backend. All methods are coroutines safe to call concurrently."""

    actors: ActorStore  # the actor tables (store/actors.py)
    subscriptions: SubscriptionStore  # subscriptions, fences, checkpoints (store/subscriptions.py)
    protocol: ProtocolStore  # the Durable Streams settings and producers (store/durable_streams.py)
    outbox: OutboxStore  # input records' delivery outbox (store/outbox.py)
    catalogue: CatalogueStore  # the SQL catalogue's mirror and queries (store/catalogue.py)
    inputs: InputStore  # instances' kept inputs (store/inputs.py)
    forks: ForkStore  # forks of instances (store/forks.py)

    # Whether ephemeral events travel between processes (PostgreSQL): then
    # ``commit`` relays them and ``on_ephemeral`` receives other processes'.
    relays_ephemeral: bool

    async def others_committed(self) -> bool:
        """Whether another process committed since the last call, for a
        backend without notifications between processes (SQLite); False
        where they arrive on their own (PostgreSQL: LISTEN/NOTIFY)."""

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None, *,
        on_queue: Callable[[str], None] | None = None,
        on_subscription: Callable[[str], None] | None = None,
    ) -> None:
        """Open connections and apply migrations. ``on_wakeup`` receives
        appends made by other processes; ``on_resync`` is called when
        notifications may have been missed (a reconnect); ``on_ephemeral``
        the ephemeral events other processes append, in commit order;
        ``on_queue`` (tenant) rows another process queued or released;
        ``on_subscription`` subscriptions another process changed
        ('tenant|path', 'tenant', or '' when processes came or went). A
        backend without notifications between processes (SQLite) calls
        none of them: the periodic sweeps find the same work."""

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        """Return once every ephemeral event committed before the call has
        reached ``on_ephemeral`` (True), or when that cannot be known: a
        lost connection dropped some, or ``timeout_s`` passed (False)."""

    async def close(self) -> None: ...

    async def schema_version(self) -> int:
        """The newest migration the database has applied (the metrics report it)."""

    def pool_sizes(self) -> tuple[int, int, int] | None:
        """(connections, idle, max) of the connection pool, from memory, for the
        metrics; None without a pool (SQLite) or before start."""

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
