"""The storage contract: what every backend provides to the layers above.

Both backends (``store.sqlite`` and ``store.postgres``) implement ``Store``
and pass the same contract suite (``tests/contract``). Nothing outside
``yoke/store`` writes SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..events import Event, PreparedEvent


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: float | None = None
    max_events: int | None = None


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


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one event of a group commit."""

    status: Literal["ok", "duplicate", "conflict"]
    offset: int | None
    id: str
    at: int


@dataclass(frozen=True, slots=True)
class CommitResult:
    closed: bool  # the stream is closed: nothing was written
    outcomes: list[Outcome]  # one per submitted event, in order
    head: int


@dataclass(frozen=True, slots=True)
class ReadPage:
    exists: bool
    head: int
    pruned_through: int
    events: list[Event]


WakeupCallback = Callable[[str, str], None]  # (tenant, path)


class Store(Protocol):
    """One backend. All methods are coroutines safe to call concurrently."""

    async def start(self, on_wakeup: WakeupCallback, on_resync: Callable[[], None]) -> None:
        """Open connections and apply migrations. ``on_wakeup`` receives
        appends made by other processes; ``on_resync`` is called when
        notifications may have been missed (a reconnect)."""

    async def close(self) -> None: ...

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
    ) -> CommitResult:
        """One transaction: create the stream if missing, lock its row, resolve
        idempotency keys (a batch with a conflicting key is rejected whole),
        assign offsets head+1.. to the accepted new events in order, insert
        the durable ones, raise the head. ``batch_of[i]`` is the caller batch
        event ``i`` belongs to."""

    async def read(self, tenant: str, path: str, after: int, limit: int) -> ReadPage:
        """Durable events with offset > after, ascending, and the stream's
        head and pruned_through from the same snapshot."""

    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage: ...

    async def info(self, tenant: str, path: str) -> StreamInfo | None: ...

    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]: ...

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, retention: Retention
    ) -> tuple[StreamInfo, bool]:
        """Create the stream if missing; returns (info, created)."""

    async def update_stream(
        self,
        tenant: str,
        path: str,
        *,
        closed: bool | None = None,
        legal_hold: bool | None = None,
        retention: Retention | None = None,
    ) -> StreamInfo | None:
        """Change settings; None when the stream does not exist."""

    async def prune(self, now: int) -> int:
        """One retention pass over every tenant; returns events removed."""
