"""Forks of actor instances: the contract and the values it passes.

A fork (actors/forks.py, docs/advanced/forks.md) is made in one process,
then kept here so that any process can list it, read its state, diff it
and discard it: what it was made from (instance, ``upto``, ``app``,
``edits``), what its runs did (``summary``, ``report``), the image of the
SQLite database it ended with, and when it expires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ForkRow:
    tenant: str
    fork_id: str
    instance_id: str
    actor: str
    key: str
    upto: int | None
    app: str | None
    edits: list[dict[str, Any]]
    summary: dict[str, Any]
    created_at: int
    expires_at: int
    report: list[dict[str, Any]] | None = None  # read only when asked for
    image: bytes | None = None  # likewise


class ForkStore(Protocol):
    """``store.forks``."""

    async def save(self, fork: ForkRow) -> None:
        """Keep a new fork (``report`` and ``image`` given)."""
        ...

    async def get(self, tenant: str, fork_id: str, *, now: int, whole: bool = False) -> ForkRow | None:
        """The fork (with its report and image when ``whole``), None if
        there is none or it expired at ``now``."""
        ...

    async def list(
        self, tenant: str, instance_id: str | None, *, after: str | None, limit: int, now: int,
    ) -> list[ForkRow]:
        """Forks not expired at ``now`` (of one instance, or all), by id."""
        ...

    async def delete(self, tenant: str, fork_id: str) -> bool: ...

    async def expire(self, tenant: str, now: int, limit: int) -> int:
        """Delete up to ``limit`` forks that expired at ``now``; how many."""
        ...
