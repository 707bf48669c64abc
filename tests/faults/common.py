"""Shared pieces of the fault suite: fresh databases, connection cuts,
progress to pace faults by, and the exact-outcome check."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from tests.conftest import PG_ADMIN_URL, admin_sql, with_database

# Exception types that must never reach a caller of the public API.
DRIVER_MODULES = ("asyncpg", "sqlite3")


def is_driver_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in DRIVER_MODULES


@contextlib.asynccontextmanager
async def pg_database(prefix: str = "yoke_fault") -> AsyncIterator[str]:
    """A new PostgreSQL database (Yoke migrates it on open), dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await admin_sql(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


class Cutter:
    """Ends every session of the runtime role on one database, as an
    operator's ``pg_terminate_backend`` (or a failover) would."""

    def __init__(self, url: str) -> None:
        self.database = database_name(url)
        self._conn: asyncpg.Connection | None = None
        self.cuts = 0
        self.sessions_ended = 0

    async def __aenter__(self) -> Cutter:
        self._conn = await asyncpg.connect(PG_ADMIN_URL)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._conn is not None
        await self._conn.close()

    async def cut(self) -> int:
        assert self._conn is not None
        ended = await self._conn.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE usename = 'yoke_runtime' AND datname = $1",
            self.database,
        )
        self.cuts += 1
        self.sessions_ended += ended
        return ended

    async def runtime_sessions(self) -> int:
        assert self._conn is not None
        return await self._conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'yoke_runtime' AND datname = $1",
            self.database,
        )


class Canceller:
    """Cancels the running statement of every active session of the runtime
    role on one database, as an operator's ``pg_cancel_backend`` (or a
    ``statement_timeout``) would: the statement fails with SQLSTATE 57014,
    its transaction is rolled back, and the session lives on."""

    def __init__(self, url: str) -> None:
        self.database = database_name(url)
        self._conn: asyncpg.Connection | None = None
        self.signalled = 0
        self.appends_signalled = 0  # of them, sessions running yoke_append

    async def __aenter__(self) -> Canceller:
        self._conn = await asyncpg.connect(PG_ADMIN_URL)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._conn is not None
        await self._conn.close()

    async def cancel(self) -> int:
        assert self._conn is not None
        rows = await self._conn.fetch(
            "SELECT pg_cancel_backend(pid) AS sent, query LIKE '%yoke_append%' AS append"
            " FROM pg_stat_activity"
            " WHERE usename = 'yoke_runtime' AND datname = $1 AND state = 'active'",
            self.database,
        )
        signalled = sum(1 for r in rows if r["sent"])
        self.signalled += signalled
        self.appends_signalled += sum(1 for r in rows if r["sent"] and r["append"])
        return signalled

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Cancel every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            await self.cancel()
            await asyncio.sleep(interval_s)


class Progress:
    """A counter that tasks can wait on (with a deadline), so faults are
    paced by the work done rather than by the clock."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Condition()

    async def add(self, n: int = 1) -> None:
        async with self._changed:
            self.count += n
            self._changed.notify_all()

    async def reach(self, n: int, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            async with self._changed:
                await self._changed.wait_for(lambda: self.count >= n)


async def wait_until(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    """Poll an async or plain predicate until it holds (for state owned by
    another process, which cannot notify this one)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def assert_exact(events: Iterable[Any], keys: Iterable[str], *, unkeyed: bool = False) -> None:
    """Offsets 1..N with no gap; every key exactly once and no other key
    (events without a key are allowed only when ``unkeyed``). ``events`` are
    Event objects or their JSON documents."""
    events = list(events)

    def field(e: Any, name: str) -> Any:
        return e[name] if isinstance(e, dict) else getattr(e, name)

    offsets = [field(e, "offset") for e in events]
    assert offsets == list(range(1, len(events) + 1)), "offsets are not gapless from 1"
    got = [field(e, "idempotency_key") for e in events]
    if not unkeyed:
        assert None not in got, "an event without a key"
    counts = Counter(k for k in got if k is not None)
    duplicates = sorted(k for k, n in counts.items() if n > 1)
    assert not duplicates, f"keys appended more than once: {duplicates[:5]}"
    expected = set(keys)
    assert set(counts) == expected, (
        f"missing {sorted(expected - set(counts))[:5]}, unexpected {sorted(set(counts) - expected)[:5]}"
    )
