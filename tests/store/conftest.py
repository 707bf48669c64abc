"""The driver conformance suite: the storage contract (``store.contract``)
exercised directly on both drivers, as River's ``riverdrivertest`` does for
its drivers. Each test gets a started store built by ``connect_store`` (no
``yoke.open``, no runtime), once on SQLite and once on PostgreSQL, and a
tenant of its own. ``tests/contract`` covers the same behaviour end to end,
through ``yoke.open``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from yoke.config import Settings
from yoke.events import PreparedEvent, prepare
from tests.conftest import now_ms
from yoke.store import Store, connect_store
from yoke.store.results import CommitResult


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/yoke.db"
    # One database per test session (tests/conftest.py); each test keeps to
    # its own tenant, workers and owners.
    return request.getfixturevalue("pg_url")


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = connect_store(Settings(database_url=store_url))
    await s.start(on_wakeup=lambda tenant, path: None, on_resync=lambda: None)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def backend(store_url: str) -> str:
    return "sqlite" if store_url.startswith("sqlite") else "postgres"


def new_id(prefix: str = "s") -> str:
    return prefix + uuid.uuid4().hex[:12]


def ev(type: str = "e", **fields: Any) -> PreparedEvent:
    return prepare({"type": type, **fields})


async def commit(
    store: Store, tenant: str, path: str, events: Sequence[PreparedEvent],
    batch_of: Sequence[int] | None = None, now: int | None = None,
) -> CommitResult:
    """A commit of ``events``, one caller batch unless ``batch_of`` says otherwise."""
    return await store.commit(
        tenant, path, events, batch_of if batch_of is not None else [0] * len(events),
        now if now is not None else now_ms(), new_id(),
    )


async def append(store: Store, tenant: str, path: str, n: int, type: str = "e") -> CommitResult:
    return await commit(store, tenant, path, [ev(type, payload={"n": i}) for i in range(n)])
