"""Forks of actor instances: the contract and the values it passes.

A fork (actors/forks.py, docs/advanced/forks.md) is made in one process,
then kept here so that any process can list it, read its state, diff it
and discard it: what it was made from (instance, ``upto``, ``app``,
``edits``), what its runs did (``summary``, ``report``), the image of the
SQLite database it ended with, and when it expires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


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


def fork_from_row(row: Sequence[Any], whole: bool = False) -> ForkRow:
    """A fork from the columns both drivers read, in this order: tenant_id,
    fork_id, instance_id, actor, key, upto, app, edits, summary, created_at,
    expires_at (then, ``whole``, report and image); JSON as text."""
    return ForkRow(
        tenant=row[0], fork_id=row[1], instance_id=row[2], actor=row[3], key=row[4], upto=row[5], app=row[6],
        edits=orjson.loads(row[7]), summary=orjson.loads(row[8]), created_at=row[9], expires_at=row[10],
        report=orjson.loads(row[11]) if whole else None, image=bytes(row[12]) if whole else None,
    )
