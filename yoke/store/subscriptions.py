"""The subscription part of the storage contract (``store.subscriptions``).

Both backends implement ``SubscriptionStore``. A subscription row holds the
reduced configuration of one (source stream, name) plus its delivery state;
``control`` is the one way its configuration changes: it appends the control
event(s) and writes the row in one transaction under the source stream's row
lock, so the catalogue never disagrees with the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..events import Event, PreparedEvent
from .results import CommitResult, Outcome


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    tenant: str
    path: str  # the source stream
    name: str
    config: dict[str, Any]  # receiver, filter, transform, start, on_failing_event
    configured_at: int  # offset of the configure event
    configured_id: str  # its event id
    configured_ms: int
    generation: int  # offset of the configure or cursor_set event that chose the cursor
    source_stream_id: str
    cursor: int  # processed_through_offset
    halted: dict[str, Any] | None = None
    # Deployment versions that halted it since its last delivery: none of
    # them resumes it automatically again.
    gave_up: tuple[str, ...] = ()
    attempts: int = 0
    skips: int = 0
    last_error: str | None = None
    # When ``last_error`` happened (ms since the epoch, the store's clock):
    # kept, like the error, after the subscription recovers.
    last_error_at: int | None = None
    next_retry_at: int = 0  # ms
    delivered: int = 0
    failures: int = 0
    secret: str | None = None
    lease_owner: str | None = None
    # Until when its holder's lease runs (ms; 0: none), as read with the
    # source's head: the holder's last heartbeat plus its lease.
    lease_until: int = 0
    head: int = 0  # the source stream's head when the row was read (for lag)
    # The failed attempts at the event after the cursor, ({number, at, error}, ...):
    # appended by ``fail``, cleared by an acknowledgement past it.
    attempt_errors: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class SubscriptionTotals:
    subscriptions: int = 0
    halted: int = 0
    lag: int = 0  # events not yet processed, summed over the subscriptions


@dataclass(frozen=True, slots=True)
class SourceState:
    """The source stream under its row lock, as ``control`` sees it."""

    stream_id: str
    created_at: int
    head: int
    # With control(copies_into=target): how many other subscriptions (not the
    # one being decided) copy into target, counted under a lock on target.
    copies_into: int = 0
    # With control(probe=...): whether the source holds an event the probe
    # describes, read under the lock (so no decision made meanwhile is missed).
    probed: bool = False
    # The control's time (the caller's clock): what the decision stamps.
    now: int = 0

    @property
    def next_offset(self) -> int:
        return self.head + 1


@dataclass(frozen=True, slots=True)
class Probe:
    """An event ``control`` looks for on the source stream before deciding:
    one of ``types``, after offset ``after``, whose payload's top-level
    ``field`` (a plain name) equals ``value``."""

    types: tuple[str, ...]
    after: int
    field: str
    value: str

    def __post_init__(self) -> None:
        if not self.field.isidentifier():
            raise ValueError(f"a probe field is a plain name, not {self.field!r}")


@dataclass(slots=True)
class Change:
    """What a control decision does: append ``events`` (in order, offsets
    from ``next_offset``) and then write ``row`` (or delete the subscription),
    dropping the name's processor checkpoint when asked.
    ``reply`` is handed back to the caller untouched."""

    events: list[PreparedEvent] = field(default_factory=list)
    row: SubscriptionRow | None = None
    delete: bool = False
    # Bookkeeping (halt, skip, resume, cursor moves, removal) is appended even
    # to a closed stream or one at its producer ceilings; a configuration is not.
    bookkeeping: bool = False
    # A new run (configure, cursor move) or a removal: the processor
    # checkpoint of this name no longer describes the cursor's fold.
    drop_checkpoint: bool = False
    reply: Any = None


def all_accepted(outcomes: Sequence[Outcome]) -> bool:
    """Did the store take every event of a kernel batch (new or a retry)?"""
    return all(o.status in ("ok", "duplicate") for o in outcomes)


# decide(current row or None, source) -> Change; raising aborts with nothing written.
Decide = Callable[[SubscriptionRow | None, SourceState], Change]


@dataclass(frozen=True, slots=True)
class DeliveryOwner:
    """A delivering process, as its heartbeat row describes it: what it can
    deliver (its deploy version, the call functions and processors its
    application registers) and where it runs."""

    owner: str
    version: str = ""
    functions: tuple[str, ...] = ()
    processors: tuple[str, ...] = ()
    host: str = ""
    pid: int = 0

    def info(self) -> dict[str, Any]:
        return {"version": self.version, "functions": list(self.functions),
                "processors": list(self.processors), "host": self.host, "pid": self.pid}

    @classmethod
    def of(cls, owner: str, info: dict[str, Any]) -> DeliveryOwner:
        return cls(owner, info.get("version", ""), tuple(info.get("functions", ())),
                   tuple(info.get("processors", ())), info.get("host", ""), info.get("pid", 0))


@dataclass(frozen=True, slots=True)
class Stamp:
    """Where a copied batch comes from: the passive fence compares these."""

    source_path: str
    name: str
    source_stream_id: str
    source_created_at: int
    generation: int


def fence_refuses(record: tuple[str, int, int], stamp: Stamp) -> bool:
    """Does the receiver's fence record (source stream id, created_at,
    generation) hold a newer stamp than ``stamp``? Equal stamps pass: they
    are at-least-once redeliveries, collapsed by idempotency keys."""
    stream_id, created_at, generation = record
    if created_at != stamp.source_created_at:
        return created_at > stamp.source_created_at  # an older source lifetime
    return stream_id == stamp.source_stream_id and generation > stamp.generation


@dataclass(frozen=True, slots=True)
class InboundRecord:
    path: str  # the receiving stream
    source_path: str
    name: str
    source_stream_id: str
    source_created_at: int
    generation: int
    received: int
    last_received_at: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    tenant: str
    path: str
    name: str
    version: str
    stream_id: str
    generation: int  # the delivery run it belongs to
    through: int
    state: Any
    complete: bool


@dataclass(frozen=True, slots=True)
class CatalogueRecord:
    """What a stream's subscription catalogue was reduced by (see
    ``subscription_catalogues`` in the schema)."""

    path: str
    stream_id: str
    reducer: str
    subscriptions: int  # rows the catalogue holds
    stage: dict[str, Any] | None  # an unfinished rebuild: {through, created_at, rows}


class SubscriptionStore(Protocol):
    async def control(
        self, tenant: str, path: str, name: str, decide: Decide, now: int, new_stream_id: str,
        *, copies_into: str | None = None, probe: Probe | None = None,
    ) -> tuple[Change, Sequence[Outcome]]:
        """One transaction: create the source stream if missing, lock its row,
        read the subscription row, call ``decide``, append its events (all
        must be accepted, else nothing is written and the outcomes say why)
        and write or delete the row.

        ``copies_into`` (a stream path): also take a lock on that target
        stream's copy count (held to the end of the transaction, so two
        configures into one target never both see room for one more) and
        give ``decide`` the number of other subscriptions copying into it as
        ``source.copies_into``.

        ``probe``: tell ``decide`` (``source.probed``) whether the source
        holds an event the probe describes, read under the stream lock (the
        failures inbox refuses to resolve a skip twice with it)."""

    async def get(self, tenant: str, path: str, name: str) -> SubscriptionRow | None: ...

    async def totals(self, tenant: str, limit: int) -> tuple[SubscriptionTotals, list[SubscriptionRow]]:
        """The tenant's subscriptions counted (all, halted, their summed lag),
        and the ``limit`` that most need a look: halted first, then by lag."""

    async def list(self, tenant: str, path: str) -> list[SubscriptionRow]:
        """The subscriptions of one source stream, by name."""

    # --- leases (subscriptions/leases.py) ------------------------------------------
    # A delivering process (an owner) holds its subscriptions while its
    # heartbeat row lives: one heartbeat renews them all. Heartbeats run on
    # the database's clock and, on PostgreSQL, a connection of their own.
    # A change others should act on (a configuration, a lease given up, an
    # owner gone) is announced to the other processes (PostgreSQL: NOTIFY
    # yoke_subscription with the tenant, or '' for every tenant).

    async def register_owner(self, owner: DeliveryOwner, lease_ms: int) -> None:
        """Join (or join again): heartbeat now; reaped after ``lease_ms`` of silence."""

    async def beat_owner(self, owner: str) -> bool:
        """Heartbeat now; False when the owner was reaped (its subscriptions are free)."""

    async def reap_owners(self, by: str) -> list[DeliveryOwner]:
        """Remove the owners other than ``by`` silent for longer than their lease."""

    async def owners(self) -> list[DeliveryOwner]:
        """The live owners."""

    async def drop_owner(self, owner: str) -> None:
        """Leave (a clean shutdown): the owner's subscriptions are free at once."""

    async def tenants(self) -> list[str]:
        """The tenants that have subscriptions."""

    async def leases(self, tenant: str, paths: Sequence[str] | None = None) -> list[SubscriptionRow]:
        """The subscriptions of the tenant (of the source ``paths``, or
        all), with their source's head: what ``leases.plan`` decides from."""

    async def take(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> list[SubscriptionRow]:
        """Lease the subscriptions ``keys`` ((path, name)) to ``owner`` where
        they are free (no holder, or one no longer live) or its own already;
        the rows it holds of them."""

    async def give(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> None:
        """Give up the subscriptions ``keys`` that ``owner`` holds (another process is preferred)."""

    async def ack(
        self, tenant: str, path: str, name: str, generation: int, through: int, delivered: int,
        now: int, checkpoint: Checkpoint | None = None, *, keep_attempts: bool = False,
        stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        """Advance the cursor to ``through`` (never back), reset the retry
        ladder (unless ``keep_attempts``: the events before a failed one got
        through, the failed one not yet) and count ``delivered``, only while
        the generation is still ``generation`` and (when given) the source
        lifetime still ``stream_id``: otherwise None and nothing changes (a
        late acknowledgement). ``checkpoint`` is saved in the same
        transaction."""

    async def fail(
        self, tenant: str, path: str, name: str, generation: int, attempts: int, error: str,
        next_retry_at: int, *, stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        """Record a failed attempt (same generation and lifetime rule as
        ``ack``): its error as ``last_error``, stamped ``last_error_at`` by
        the store's clock (what its kept attempt says too)."""

    async def append_copies(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], stamp: Stamp, now: int,
        new_stream_id: str,
    ) -> CommitResult | None:
        """Append copies to the receiving stream ``path`` and update its
        passive-fence record for the stamp, in one transaction; None (nothing
        appended) when the record holds a newer stamp."""

    async def inbound(self, tenant: str, path: str) -> list[InboundRecord]: ...

    async def events_of_types(
        self, tenant: str, path: str, types: Sequence[str], after: int, limit: int
    ) -> list[Event]:
        """The durable events of ``path`` whose type is one of ``types``,
        with offset > ``after``, ascending, at most ``limit``: the failures
        inbox finds skip audit lines and their resolutions with it, without
        reading the other events."""

    async def checkpoint(self, tenant: str, path: str, name: str) -> Checkpoint | None: ...

    async def save_checkpoint(self, checkpoint: Checkpoint, now: int) -> bool:
        """Save a (rebuild's) checkpoint while its subscription is still in
        the checkpoint's generation; False (nothing saved) otherwise. (A
        checkpoint of another source lifetime is never used: the runner
        rebuilds it.)"""

    async def write_catalogue(
        self, tenant: str, path: str, head: int,
        merge: Callable[[list[SubscriptionRow]], list[SubscriptionRow]],
        *, reducer: str = "", stream_id: str = "", now: int = 0,
    ) -> bool:
        """A rebuild from the log read through ``head``: under the stream row
        lock, unless the head moved meanwhile or the stream is not of the
        lifetime ``stream_id`` (when given) (False, nothing written), replace
        the subscriptions of ``path`` with ``merge(current rows)`` (rows it
        does not return are removed) and, in the same transaction, record
        the catalogue as reduced by ``reducer`` (its stage removed)."""

    async def stale_catalogues(self, tenant: str, reducer: str) -> list[str]:
        """The paths whose catalogue must be rebuilt: rows but no record, or a
        record of another reducer or stream lifetime, with a stage, or whose
        row count disagrees with the rows there are."""

    async def catalogue(self, tenant: str, path: str) -> CatalogueRecord | None: ...

    async def save_catalogue_stage(
        self, tenant: str, path: str, stream_id: str, reducer: str, stage: dict[str, Any], now: int
    ) -> bool:
        """Save a rebuild's progress while the stream is still the lifetime
        ``stream_id``; False (nothing saved) otherwise."""
