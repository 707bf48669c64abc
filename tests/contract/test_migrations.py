"""PostgreSQL migrations: numbered, recorded, safe when processes race."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import asyncpg
import pytest

from tests.conftest import PG_ADMIN_URL, with_database
from yoke.store.postgres import migrate


@pytest.fixture
async def fresh_db():
    name = f"yoke_mig_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_concurrent_migrations_apply_each_version_once(fresh_db):
    conns = [await asyncpg.connect(fresh_db) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(migrate.migrate(c) for c in conns))
        names = [n for a in applied for n in a]
        expected = [name for _, name, _ in migrate.available()]
        assert sorted(names) == sorted(expected)  # each applied by exactly one
        rows = await conns[0].fetch("SELECT version FROM yoke_schema_version ORDER BY version")
        assert [r[0] for r in rows] == [v for v, _, _ in migrate.available()]
        assert await migrate.pending(conns[0]) == []
    finally:
        for c in conns:
            await c.close()


async def test_every_tenant_table_forces_row_level_security(fresh_db):
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate.migrate(conn)
        rows = await conn.fetch(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'"
            " WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
        )
        # Tenant directories (names only) are read across tenants by maintenance
        # passes and the subscription claim; every other table is isolated.
        directories = {"yoke_tenants", "subscription_tenants"}
        tenant_tables = {r[0]: (r[1], r[2]) for r in rows if r[0] not in directories}
        assert tenant_tables and all(v == (True, True) for v in tenant_tables.values()), tenant_tables
    finally:
        await conn.close()


def test_yoke_migrate_command(fresh_db):
    env = {**os.environ, "YOKE_DATABASE_URL": fresh_db}
    out = subprocess.run(
        [sys.executable, "-m", "yoke.cli", "migrate"], env=env, capture_output=True, text=True, check=True
    )
    assert "0001_streams.sql" in out.stdout
    again = subprocess.run(
        [sys.executable, "-m", "yoke.cli", "migrate"], env=env, capture_output=True, text=True, check=True
    )
    assert "up to date" in again.stdout


async def test_readiness_checks_the_schema(db_url):
    import yoke

    async with yoke.open(db_url) as y:
        await y.ready()
