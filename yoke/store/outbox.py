"""The input delivery outbox part of the storage contract (``store.outbox``).

Input records and their delivery outbox commit together; a dispatcher
publishes a deterministic wake event for them through the workflow wait
service. ``append_input`` writes the records and one outbox row per
new record in one transaction; the dispatcher (``streams/inputs.py``)
reads due rows, publishes each record's wake event and deletes the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..events import PreparedEvent
from .results import CommitResult


@dataclass(frozen=True, slots=True)
class Delivery:
    """One input record whose wake event may not be published yet."""

    tenant: str
    path: str  # the input stream
    lifetime_id: str  # its stream_id: a recreated stream's records are other records
    offset: int
    record_id: str
    wake_path: str
    attempts: int


class OutboxStore(Protocol):
    async def append_input(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], now: int, new_stream_id: str,
        wake_path: str,
    ) -> CommitResult:
        """Append one caller batch (all or nothing, as ``Store.commit``) and,
        in the same transaction, an outbox row for each new record (a
        duplicate by idempotency key has its own row already, or had)."""

    async def due(self, now: int, limit: int) -> list[Delivery]:
        """Outbox rows whose next attempt is due, oldest first, across tenants."""

    async def done(self, tenant: str, path: str, offset: int) -> None:
        """The record's wake event is published: forget the row."""

    async def retry(self, tenant: str, path: str, offset: int, next_at: int, error: str) -> None:
        """Publishing failed: attempts + 1, try again at ``next_at``."""
