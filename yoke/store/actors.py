"""The storage contract for actors: instances, fan-out cursors, queues,
workers, per-instance SQLite blobs, schedules and conversations.

Each backend's ``Store`` exposes an ``actors`` attribute implementing
``ActorStore``; the contract suite runs it on both backends.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from ..events import PreparedEvent
from .inputs import Completion
from .results import Outcome


MAX_ATTEMPT_ERRORS = 50  # failed attempts whose error a queue row or subscription keeps
MAX_ATTEMPT_ERROR_CHARS = 2000


def attempt_error(number: int, at: int, error: str) -> str:
    """One failed attempt as the JSON the ``attempt_errors`` columns hold."""
    return orjson.dumps({"number": number, "at": at, "error": error[:MAX_ATTEMPT_ERROR_CHARS]}).decode()


# ``claimable_after`` of an instance its worker is giving up (release_excess)
# while a row of it still runs: no claim takes a new row of it meanwhile.
DRAINING = 9_000_000_000_000_000


def new_instance_id() -> str:
    return "inst_" + secrets.token_hex(10)


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    instance_id: str
    tenant: str
    actor: str
    key: str
    config: dict[str, Any] = field(default_factory=dict)
    # The instance's own filter as stored (types, streams, where); None when
    # the actor routes by key (keyed and singleton actors).
    filter: dict[str, Any] | None = None
    parent_id: str | None = None
    worker_id: str | None = None
    created_at: int = 0

    @property
    def id(self) -> str:
        """The instance's id, by the name HTTP and the CLI give it
        (``instance_id`` is the same: the field's older spelling)."""
        return self.instance_id


@dataclass(frozen=True, slots=True)
class StateHome:
    """Where the instances' state databases live (actors/state_home.py):
    a storage mode and, within it, a location (a data directory's id for
    file storage, the bucket and prefix for s3, nothing for pg_sqlite);
    ``label`` says it to a person."""

    storage: str
    location: str
    label: str
    recorded_at: int = 0

    def same_place(self, other: StateHome) -> bool:
        return (self.storage, self.location) == (other.storage, other.location)


@dataclass(frozen=True, slots=True)
class Reaped:
    """A worker removed for a stale heartbeat."""

    worker_id: str
    silent_ms: int  # since its last heartbeat, by the database's clock
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class QueueItem:
    """One event to enqueue. ``instance_id`` names the instance, or else
    (``actor``, ``key``) does and the instance is created when missing
    (keyed routing: one instance per key, whatever the concurrency)."""

    event_json: str
    group_id: str | None = None
    priority: int = 0
    path: str | None = None  # the stream the event came from (None: sent directly)
    offset: int | None = None
    instance_id: str | None = None
    actor: str | None = None
    key: str | None = None
    available_at: int = 0


@dataclass(frozen=True, slots=True)
class QueueRow:
    qid: int
    tenant: str
    instance_id: str
    group_id: str | None
    priority: int
    path: str | None
    offset: int | None
    event: dict[str, Any]
    status: Literal["pending", "processing", "dead"]
    attempts: int
    available_at: int
    lease_until: int | None
    worker_id: str | None
    enqueued_at: int
    started_at: int | None
    last_error: str | None
    last_traceback: str | None
    actor: str = ""
    # The failed attempts of its event, [{number, at, error}] (the first
    # MAX_ATTEMPT_ERRORS; read by the failures inbox, not by claims).
    attempt_errors: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """What a worker can run of one actor: its concurrency per (instance,
    group) and how long a claim's lease lasts."""

    actor: str
    concurrency: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class QueueDepth:
    pending: int = 0
    processing: int = 0
    dead: int = 0


@dataclass(frozen=True, slots=True)
class Schedule:
    tenant: str
    instance_id: str
    name: str
    due_at: int
    event: dict[str, Any]
    cron: str | None = None
    stream: str | None = None  # append to this stream instead of the instance's queue
    created_at: int = 0


@dataclass(frozen=True, slots=True)
class Message:
    conversation_id: str
    message_id: str
    seq: int
    role: str
    content: Any
    metadata: dict[str, Any]
    at: int
    offset: int | None  # of the conversation.message.posted event


@dataclass(frozen=True, slots=True)
class Effect:
    """One journaled effect of an actor run (docs/advanced/effects.md): the queue row
    ``qid`` whose run performs it, the digest of the op's name and canonical
    params, and which occurrence of that op in the run it is. Journaled
    store methods record their result under it in the effect's own
    transaction; given an effect already recorded they perform nothing and
    return the recorded result."""

    qid: int
    digest: str
    occurrence: int


@dataclass(frozen=True, slots=True)
class RunAppend:
    """An event an atomic run appends; with ``message``, a conversation post
    (the message is stored with its event's offset)."""

    path: str
    event: PreparedEvent
    message: Message | None = None


@dataclass(frozen=True, slots=True)
class RunCommit:
    """Everything an atomic run's store transaction does (actors/atomic.py),
    with the completion of queue row ``qid`` (claimed at ``attempts``)."""

    qid: int
    attempts: int
    instance_id: str
    appends: list[RunAppend] = field(default_factory=list)  # in call order
    schedules: list[Schedule | str] = field(default_factory=list)  # upserts, and cancels by name
    instances: list[InstanceInfo] = field(default_factory=list)
    stream_ids: dict[str, str] = field(default_factory=dict)  # a new lifetime id per path appended to
    state: bytes | None = None  # the instance database's image (pg_sqlite storage)
    # The row kept as the instance's input (store/inputs.py): by what code, with what tape.
    code_version: str | None = None
    tape: str | None = None
    keep: bool = True

    def completion(self) -> Completion:
        return Completion(self.qid, self.attempts, 0, self.code_version, self.tape, self.keep)

    def by_stream(self) -> list[tuple[str, list[RunAppend]]]:
        """The appends per stream, streams in path order (the order their
        rows are locked in), each stream's in call order."""
        streams: dict[str, list[RunAppend]] = {}
        for a in self.appends:
            streams.setdefault(a.path, []).append(a)
        return sorted(streams.items())


class RunUndone(Exception):
    """Inside ``commit_run``: roll the transaction back and answer ``status``."""

    def __init__(self, status: str, path: str | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.path = path


def message_record(message: Message, outcome: Outcome) -> dict[str, Any]:
    """A posted message as its effect's journal keeps it."""
    return {"message": dataclasses.asdict(message), "id": outcome.id, "at": outcome.at}


def message_from_record(record: dict[str, Any]) -> tuple[Message, Outcome]:
    message = Message(**record["message"])
    return message, Outcome("duplicate", message.offset, record["id"], record["at"])


@dataclass(frozen=True, slots=True)
class FanoutLag:
    path: str
    head: int
    through: int


@dataclass(frozen=True, slots=True)
class Agenda:
    """A tenant's actor work at one time: how much is runnable now, and
    when the next thing falls due (ms; None: nothing waits)."""

    runnable: int
    next_due: int | None


class ActorStore(Protocol):
    # --- instances -----------------------------------------------------------

    async def create_instance(
        self, instance: InstanceInfo, effect: Effect | None = None
    ) -> tuple[InstanceInfo, bool]:
        """Insert unless (tenant, actor, key) exists; returns (row, created).
        Bumps the tenant's routing version when the instance has a filter.
        ``effect`` recorded already: that call's row, created False."""

    async def remove_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        """Delete the instance with its queue rows, schedules and stored
        state, and append ``yoke.instance.removed`` to ``/``, in one
        transaction; None when there is no such instance."""

    async def get_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None: ...

    async def get_instances(self, tenant: str, instance_ids: Sequence[str]) -> list[InstanceInfo]:
        """The instances that exist among ``instance_ids`` (one query)."""

    async def find_instance(self, tenant: str, actor: str, key: str) -> InstanceInfo | None: ...

    async def list_instances(
        self, tenant: str, actor: str | None, limit: int, after: str | None
    ) -> list[InstanceInfo]:
        """By instance id, after ``after``."""

    async def routing(self, tenant: str) -> tuple[int, list[InstanceInfo]]:
        """The routing version and every instance that has its own filter."""

    async def tenants(self) -> list[str]: ...

    # --- fan-out -------------------------------------------------------------

    async def fanout_lag(self, tenant: str) -> list[FanoutLag]:
        """Streams of ``tenant`` whose head is past their fan-out cursor."""

    async def fanout_cursor(self, tenant: str, path: str) -> int | None:
        """How far ``path`` was fanned out (0: not yet); None if no such stream."""

    async def fanout_commit(
        self, tenant: str, path: str, expected: int, through: int, routing_version: int,
        items: Sequence[QueueItem], worker_id: str | None, now: int,
    ) -> Literal["ok", "moved", "stale"]:
        """One transaction: unless the stream's cursor moved from ``expected``
        (another process fanned these events out: 'moved') or the routing
        version changed ('stale'), enqueue ``items`` (creating keyed
        instances, owned by ``worker_id``) and set the cursor to ``through``."""

    # --- queue ---------------------------------------------------------------

    async def enqueue(self, tenant: str, items: Sequence[QueueItem], now: int) -> None: ...

    async def claim(
        self, tenant: str, worker_id: str, policies: Sequence[Policy], now: int, limit: int,
        done: Sequence[Completion | tuple[int, int]] = (),
        shard: tuple[int, int] = (0, 1),
    ) -> list[QueueRow]:
        """One round trip: delete the finished rows ``done`` (as ``complete``),
        then in one statement mark up to ``limit`` rows processing for the
        instances of shard ``shard[0]`` of ``shard[1]`` (by a hash of the id)
        owned by ``worker_id``: pending rows that are due and rows whose lease
        expired, by priority then enqueue order within each (instance,
        group), no more per group than the policy's concurrency minus the
        rows holding an unexpired lease."""

    async def complete(self, tenant: str, done: Sequence[Completion | tuple[int, int]]) -> None:
        """Delete processed rows, given as (qid, attempts) of their claim,
        each kept as its instance's input (store/inputs.py) in the same
        transaction."""

    async def fail(
        self, tenant: str, qid: int, attempts: int, *, retry_at: int | None, error: str,
        traceback: str, kept: Completion | None = None,
    ) -> None:
        """Back to pending due at ``retry_at``, or dead when it is None: then
        kept as its instance's input (``kept`` says by what code, with what
        tape), dead-lettered, in the same transaction."""

    async def queue_rows(
        self, tenant: str, instance_id: str, status: str | None, limit: int
    ) -> list[QueueRow]: ...

    async def queue_depth(self, tenant: str, instance_id: str | None) -> QueueDepth: ...

    async def dead_by_instance(self, tenant: str, limit: int) -> list[tuple[str, int]]:
        """(instance_id, dead rows) of the instances with the most dead rows, most first."""

    async def redrive(
        self, tenant: str, instance_id: str, qids: Sequence[int] | None, now: int, replayed_in: str | None = None
    ) -> int:
        """Dead rows back to pending with attempts reset (all when qids is None)."""

    async def drop_dead(self, tenant: str, instance_id: str, qids: Sequence[int] | None) -> int: ...

    async def dead_letters(
        self, tenant: str, *, qid: int | None = None, instance_id: str | None = None,
        actor: str | None = None, path: str | None = None, since: int | None = None,
        until: int | None = None, limit: int = 100,
    ) -> list[QueueRow]:
        """Dead rows of every instance (each with its actor), filtered by
        whichever of queue row, instance, actor, source stream and the time
        of the last attempt (``started_at``; ``since`` <= t < ``until``) are
        given; oldest last attempt first."""

    async def dead_letter_times(self, tenant: str, limit: int) -> list[int]:
        """The time of each dead row's last attempt (``started_at``), oldest
        first, at most ``limit`` (past it the oldest are still counted)."""

    async def resolve_dead(
        self, tenant: str, qid: int, *, drop: bool, event_json: str | None, audit: PreparedEvent, path: str,
        now: int, new_stream_id: str,
    ) -> Outcome | None:
        """One transaction: the dead row deleted (``drop``) or back to pending
        with attempts reset (its event replaced by ``event_json`` when given),
        and ``audit`` appended to ``path`` as kernel bookkeeping (a closed or
        full stream takes it); None, with nothing done, when the row is not
        dead (gone, or resolved meanwhile). The failures inbox's dead-letter
        replay and discard."""

    async def unfinished(self, actors: Sequence[str]) -> int:
        """Pending and processing rows of instances of ``actors``, plus events
        not fanned out yet, over every tenant."""

    async def agenda(self, tenant: str, now: int) -> Agenda:
        """Runnable at ``now``: queue rows processing, or pending and due;
        events not fanned out yet; schedules due. Next due: the earliest
        later ``available_at`` of a pending row or ``due_at`` of a schedule
        (what a test's virtual clock jumps to, ``yoke.testing``)."""

    async def unfinished_rows(self, tenant: str, actors: Sequence[str], limit: int) -> list[QueueRow]:
        """Up to ``limit`` pending and processing rows of instances of
        ``actors`` (``actor`` filled in), the most attempted first: what
        keeps a tenant busy, for ``wait_idle``'s answer."""

    # --- workers -------------------------------------------------------------

    # Heartbeats run on the database's clock (every process's beats and
    # reaps compare times from one clock) and, on PostgreSQL, on a connection
    # of their own: a beat never waits behind the runtime's work.

    async def register_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        """Join, or join again after being reaped: heartbeat now."""

    async def heartbeat(self, worker_id: str) -> bool:
        """Heartbeat now; False when the worker was reaped (its instances go to others)."""

    async def unregister_worker(self, worker_id: str) -> None:
        """Leave cleanly: the worker's instances become unowned."""

    async def reap_workers(self, by: str, stale_ms: int) -> list[Reaped]:
        """Remove the workers other than ``by`` whose last heartbeat is more
        than ``stale_ms`` old."""

    async def live_workers(self) -> list[str]: ...

    async def release_instances(self, tenant: str, worker_ids: Sequence[str]) -> int:
        """Unown the instances of gone workers (their leases expire on their own)."""

    async def release_excess(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> list[str]:
        """Give up this worker's instances (of ``actors``; None: any) beyond
        its fair share of the tenant's (ceil(instances / ``workers``)) for
        the other workers to adopt: those with no row processing now
        (draining ones first); the rest of the excess drains (``DRAINING``:
        claims take no new row of it) and goes on a later call once idle.
        At its share, nothing drains any more. Never while a claim of this
        worker is under way, so no run of a released instance starts here
        after it. The instance ids released."""

    async def adopt_instances(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> int:
        """Take unowned instances (of ``actors``, the ones this worker can
        run; None: any), up to a fair share of the tenant's."""

    # --- where the per-instance databases live ---------------------------------

    async def record_state_home(self, home: StateHome) -> StateHome:
        """Record ``home`` unless a home is recorded already; the recorded one."""

    async def state_home(self) -> StateHome | None:
        """The recorded home, if any executor recorded one."""

    # --- per-instance SQLite databases (pg_sqlite storage) -------------------

    async def load_state(self, tenant: str, instance_id: str) -> bytes | None: ...

    async def save_state(self, tenant: str, instance_id: str, data: bytes, now: int) -> None: ...

    # --- schedules -----------------------------------------------------------

    async def upsert_schedule(self, schedule: Schedule, effect: Effect | None = None) -> int:
        """Create or replace; returns the due time (``effect`` recorded
        already: the recorded one, nothing written)."""

    async def cancel_schedule(
        self, tenant: str, instance_id: str, name: str, effect: Effect | None = None
    ) -> bool: ...

    async def schedules(self, tenant: str, instance_id: str) -> list[Schedule]: ...

    async def due_schedules(self, tenant: str, now: int, limit: int) -> list[Schedule]: ...

    async def fire_schedule(
        self, schedule: Schedule, next_due: int | None, item: QueueItem | None, now: int
    ) -> bool:
        """If the schedule is still due at ``schedule.due_at``: enqueue ``item``
        (when given) and move the schedule to ``next_due`` (or delete it), in
        one transaction. False when someone else fired or changed it."""

    # --- conversations -------------------------------------------------------

    async def post_message(
        self, tenant: str, path: str, message: Message, event: PreparedEvent, now: int,
        new_stream_id: str, effect: Effect | None = None,
    ) -> tuple[Message | None, Outcome]:
        """Store the message and append ``event`` to ``path`` in one
        transaction; when the append is refused (closed stream, no credit)
        nothing is stored and the message is None. ``effect`` recorded
        already: the recorded message, nothing written."""

    async def messages(
        self, tenant: str, conversation_id: str, after: int | None, limit: int
    ) -> list[Message]: ...

    # --- atomic runs ---------------------------------------------------------

    async def commit_run(self, tenant: str, run: RunCommit, now: int) -> tuple[str, str | None]:
        """One transaction: complete queue row ``run.qid`` (still processing
        at ``run.attempts``), append, store messages, upsert and cancel
        schedules, create instances and save the state image. ("ok", None);
        ("lost", None) when the row is no longer this claim's; (a refusal
        status, its path) when an append is refused. Anything but "ok"
        writes nothing."""
