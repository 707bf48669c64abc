"""The Durable Streams part of the storage contract (``store.protocol``).

A protocol stream is a Yoke stream plus one ``protocol_streams`` row (its
content type, TTL or expiry, the fork it was created as, the last
``Stream-Seq``, the producer request that closed it) and the idempotent
producers' state in ``protocol_producers``. Appends still go through
``Store.commit`` (group commit): a caller batch may carry a ``Guard``
(producer headers, ``Stream-Seq``, close after the append), which the store
decides under the stream row lock, in the transaction that appends the
batch, with ``GuardBook`` (the same rules on both backends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..events import PreparedEvent
from .results import CommitResult, Outcome

# A stream Yoke created (its own API, a first append) has no protocol row: it
# reads through the protocol as a JSON stream without expiry.
NATIVE_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class ProtocolStream:
    sid: int
    stream_id: str
    path: str
    created_at: int
    head: int
    pruned_through: int
    closed: bool
    content_type: str
    ttl_s: int | None = None
    expires_at: str | None = None  # Stream-Expires-At as given
    expires_ms: int | None = None
    touched_ms: int = 0
    fork_of: str | None = None
    fork_offset: int | None = None
    fork_sub: int = 0
    stream_seq: str | None = None
    closed_by: str | None = None
    deleted: bool = False  # soft-deleted: DELETEd while forks of it live
    native: bool = False  # no protocol row

    def expired(self, now_ms: int) -> bool:
        if self.expires_ms is not None and now_ms >= self.expires_ms:
            return True
        return self.ttl_s is not None and now_ms >= self.touched_ms + self.ttl_s * 1000


@dataclass(frozen=True, slots=True)
class CreateSpec:
    """A PUT: the stream's protocol settings, its initial messages, and a fork."""

    content_type: str | None  # None: a fork inherits its source's
    ttl_s: int | None = None
    expires_at: str | None = None
    expires_ms: int | None = None
    closed: bool = False
    events: Sequence[PreparedEvent] = ()
    fork_of: str | None = None
    fork_offset: int | None = None  # None: the source's head
    fork_sub: int = 0


@dataclass(frozen=True, slots=True)
class Guard:
    """What a protocol append asks the store to check and record with it."""

    producer: tuple[str, int, int] | None = None  # (Producer-Id, epoch, seq)
    stream_seq: str | None = None
    close: bool = False
    # The lifetime (``stream_id``) the append was decided for, from a lookup
    # the route made earlier (or remembered): another lifetime at the path,
    # or this one soft-deleted, refuses the batch as "gone".
    stream_id: str | None = None

    def gone(self, stream_id: str | None, deleted: bool) -> bool:
        """Whether this guard's lifetime rules out the stream at the path
        (``stream_id``; ``deleted``: soft-deleted)."""
        return self.stream_id is not None and (self.stream_id != stream_id or deleted)

    @property
    def lifetime_only(self) -> bool:
        """Whether the guard checks the stream's lifetime and nothing else."""
        return self.producer is None and self.stream_seq is None and not self.close

    def closing_tuple(self) -> str | None:
        if self.producer is None:
            return None
        pid, epoch, seq = self.producer
        return f"{epoch}|{seq}|{pid}"


GuardStatus = Literal["ok", "duplicate", "stale_epoch", "epoch_seq", "seq_gap", "stream_seq", "closed", "gone"]


@dataclass(frozen=True, slots=True)
class GuardOutcome:
    status: GuardStatus
    epoch: int | None = None  # stale_epoch: the current one
    last_seq: int | None = None  # duplicate: the highest accepted
    expected_seq: int | None = None  # seq_gap
    received_seq: int | None = None
    closed: bool = False  # the stream is closed after this batch
    head: int = 0  # the stream's head after this batch (filled by the backend)


@dataclass(slots=True)
class GuardBook:
    """The guard rules, decided batch by batch in commit order (a later batch
    of the same group sees what an earlier one changed)."""

    closed: bool
    closed_by: str | None
    stream_seq: str | None
    producers: dict[str, tuple[int, int]]  # producer id -> (epoch, last seq)
    stream_id: str | None = None  # the stream's lifetime
    deleted: bool = False  # soft-deleted
    changed: dict[str, tuple[int, int]] = field(default_factory=dict)
    stream_changed: bool = False

    def decide(self, guard: Guard | None, events: int) -> GuardOutcome:
        if guard is not None and guard.gone(self.stream_id, self.deleted):
            return GuardOutcome("gone")
        if self.closed:
            if guard is not None and guard.producer is not None and guard.closing_tuple() == self.closed_by:
                return GuardOutcome("duplicate", epoch=guard.producer[1], last_seq=guard.producer[2], closed=True)
            if events == 0 and guard is not None and guard.close and guard.producer is None:
                return GuardOutcome("ok", closed=True)  # closing a closed stream again
            return GuardOutcome("closed", closed=True)
        if guard is None:
            return GuardOutcome("ok")
        proposed: tuple[str, tuple[int, int]] | None = None
        if guard.producer is not None:
            pid, epoch, seq = guard.producer
            state = self.producers.get(pid)
            if state is None:
                if seq != 0:
                    return GuardOutcome("seq_gap", expected_seq=0, received_seq=seq)
                proposed = (pid, (epoch, 0))
            elif epoch < state[0]:
                return GuardOutcome("stale_epoch", epoch=state[0])
            elif epoch > state[0]:
                if seq != 0:
                    return GuardOutcome("epoch_seq")
                proposed = (pid, (epoch, 0))
            elif seq <= state[1]:
                return GuardOutcome("duplicate", epoch=epoch, last_seq=state[1])
            elif seq == state[1] + 1:
                proposed = (pid, (epoch, seq))
            else:
                return GuardOutcome("seq_gap", expected_seq=state[1] + 1, received_seq=seq)
        if guard.stream_seq is not None:
            if self.stream_seq is not None and guard.stream_seq.encode() <= self.stream_seq.encode():
                return GuardOutcome("stream_seq")
            self.stream_seq = guard.stream_seq
            self.stream_changed = True
        if proposed is not None:
            self.producers[proposed[0]] = proposed[1]
            self.changed[proposed[0]] = proposed[1]
        if guard.close:
            self.closed = True
            self.closed_by = guard.closing_tuple()
            self.stream_changed = True
        return GuardOutcome("ok", epoch=None if guard.producer is None else guard.producer[1],
                            last_seq=None if guard.producer is None else guard.producer[2], closed=self.closed)


OK = GuardOutcome("ok")


def one_lifetime(guards: Sequence[Guard | None]) -> str | None:
    """The lifetime the guarded batches were all decided for, when that is
    all their guards check; None when any checks more or they disagree."""
    lifetimes = {g.stream_id if g.lifetime_only else None for g in guards if g is not None}
    return lifetimes.pop() if len(lifetimes) == 1 else None


def decide_batches(
    book: GuardBook, events: Sequence[PreparedEvent], batch_of: Sequence[int], guards: Sequence[Guard | None]
) -> tuple[list[GuardOutcome], list[PreparedEvent], list[int]]:
    counts = [0] * len(guards)
    for b in batch_of:
        counts[b] += 1
    decided = [book.decide(g, counts[i]) for i, g in enumerate(guards)]
    admitted: list[PreparedEvent] = []
    admitted_batch: list[int] = []
    for e, b in zip(events, batch_of):
        if decided[b].status == "ok":
            admitted.append(e)
            admitted_batch.append(b)
    return decided, admitted, admitted_batch


def assemble(
    events: Sequence[PreparedEvent], batch_of: Sequence[int], decided: list[GuardOutcome],
    result: CommitResult, head: int, now: int,
) -> CommitResult:
    """Every submitted event's outcome, in order: the committed ones from
    ``result``, the guarded-off ones with their batch's guard status."""
    outcomes: list[Outcome] = []
    committed = iter(result.outcomes)
    for e, b in zip(events, batch_of):
        if decided[b].status == "ok":
            outcomes.append(next(committed))
        else:
            outcomes.append(Outcome("guarded", None, e.id, now))  # type: ignore[arg-type]
    return CommitResult(outcomes=outcomes, head=head, guards=decided)


class ProtocolStore(Protocol):
    async def stream(self, tenant: str, path: str) -> ProtocolStream | None:
        """The stream with its protocol settings; None when it does not exist."""

    async def create(
        self, tenant: str, path: str, stream_id: str, now: int, spec: CreateSpec
    ) -> tuple[ProtocolStream, bool]:
        """One transaction: if the path holds a stream, return it (False);
        else create it with its protocol row, a fork's inherited events
        (copied at their offsets), the initial events, closed if asked
        (True). A fork's source missing is ``StreamNotFound``; an offset
        beyond its head or a sub-offset past the next message is
        ``InvalidInput``."""

    async def touch(self, tenant: str, sid: int, now: int) -> None:
        """A read or write of a stream with a TTL: its window starts again."""

    async def forks(self, tenant: str, path: str) -> int:
        """How many streams (soft-deleted ones too) were forked from ``path``."""

    async def soft_delete(self, tenant: str, sid: int, now: int) -> None:
        """Mark the stream deleted while forks of it live (``Stream.delete``
        removes it, with its protocol rows, once none does); ``LegalHold``
        while a legal hold is on, decided under the stream row's lock."""
