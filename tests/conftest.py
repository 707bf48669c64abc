"""Shared fixtures. PostgreSQL tests use a uniquely named database created
for the run on ``YOKE_TEST_PG_URL`` and dropped afterwards."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import yoke
from yoke.clock import SYSTEM, wall_ms

PG_ADMIN_URL = os.environ.get("YOKE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

# The longest test files, longest first (`pytest --durations=0`, summed per
# file: schemathesis alone is a fifth of the suite). `make test` hands whole
# files to its workers in collection order (--dist loadfile
# --no-loadscope-reorder): started last, a long file ran alone at the end for
# minutes while the other workers idled.
LONGEST_FIRST = [
    "tests/http/test_schemathesis_postgres.py",
    "tests/http/test_schemathesis_sqlite.py",
    "tests/ha/test_failover.py",
    "tests/chaos/test_membership.py",
    "tests/browser/test_console.py",
    "tests/actors/test_isolation.py",
    "tests/faults/test_memory_caps.py",
    "tests/durable_streams/test_conformance.py",
    "tests/production/test_container.py",
    "tests/faults/test_atomic_kill9.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep their order


def now_ms() -> int:
    """The real clock's time in ms: what a store or runtime built without a
    clock of its own stamps (tests that call the store directly pass it)."""
    return wall_ms(SYSTEM)


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


async def admin_sql(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"yoke_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        asyncio.run(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """The database URL of each backend; a test runs once per backend
    (``indirect`` parametrization with ["postgres"] selects one)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/yoke.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def backend(db_url: str) -> str:
    return "sqlite" if db_url.startswith("sqlite") else "postgres"


@pytest.fixture
def tenant() -> str:
    """A tenant of its own per test, so tests sharing one database never meet."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
async def y(db_url: str) -> AsyncIterator[yoke.Runtime]:
    async with yoke.open(db_url) as runtime:
        yield runtime


@pytest.fixture(scope="session")
def pg_actors_db() -> Iterator[str]:
    """A migrated database for tests that need one to themselves (workers,
    cursors and fan-out span every tenant of a database): emptied before
    each such test, which is much cheaper than creating a database."""
    from yoke.store.postgres.migrate import migrate

    name = f"yoke_actors_{uuid.uuid4().hex[:12]}"

    async def build() -> None:
        await admin_sql(f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(with_database(PG_ADMIN_URL, name))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    # Requested from async fixtures too: run on a thread of its own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, build()).result()
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        asyncio.run(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def empty_database(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        tables = [r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            # yoke_relay holds the relay channel's name, drawn by its migration
            " AND tablename NOT IN ('yoke_schema_version', 'yoke_relay')"
        )]
        await conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def fresh_url(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[str]:
    """A database of the test's own, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/yoke.db"
        return
    url = request.getfixturevalue("pg_actors_db")
    await empty_database(url)
    yield url
