"""Numbered SQL migrations, applied under an advisory lock.

Files ``migrations/NNNN_name.sql`` are applied in order, each in its own
transaction, and recorded in ``yoke_schema_version``. The advisory lock makes
two processes starting together apply each migration exactly once: the
second waits, then finds nothing left to do.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

# An arbitrary constant identifying Yoke's migration lock.
MIGRATION_LOCK_KEY = 0x5E0CE_0001


def available() -> list[tuple[int, str, str]]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


async def applied_versions(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('yoke_schema_version') IS NOT NULL")
    if not exists:
        return set()
    return {r[0] for r in await conn.fetch("SELECT version FROM yoke_schema_version")}


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied by this call."""
    done: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        # Only when missing: a login that may not create tables (the runtime
        # role on a database migrated before) finds nothing to do.
        if not await conn.fetchval("SELECT to_regclass('yoke_schema_version') IS NOT NULL"):
            await conn.execute(
                "CREATE TABLE yoke_schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
        applied = await applied_versions(conn)
        for version, name, sql in available():
            if version in applied:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO yoke_schema_version (version, name) VALUES ($1, $2)", version, name
                )
            done.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return done


async def pending(conn: asyncpg.Connection) -> list[str]:
    applied = await applied_versions(conn)
    return [name for version, name, _ in available() if version not in applied]
