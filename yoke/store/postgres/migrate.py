"""Numbered SQL migrations, applied under an advisory lock.

Files ``migrations/NNNN_name.sql`` are applied in order, each in its own
transaction, and recorded in ``yoke_schema_version`` with their file name
and checksum. The advisory lock makes two processes starting together apply
each migration exactly once: the second waits, then finds nothing left to
do. Before applying anything, the recorded migrations must be this
version's files (``schema.check_recorded``): a database migrated with an
older file of the same number fails fast instead of skipping the new one.
"""

from __future__ import annotations

import asyncpg

from . import roles
from ..schema import Migration, Recorded, Status, check_recorded, check_startable, read_migrations
from ..schema import status as schema_status

# An arbitrary constant identifying Yoke's migration lock.
MIGRATION_LOCK_KEY = 0x5E0CE_0001


def available() -> list[tuple[int, str, str]]:
    return [(m.version, m.name, m.sql) for m in migrations()]


def migrations() -> list[Migration]:
    return read_migrations(__package__)


async def recorded(conn: asyncpg.Connection) -> dict[int, Recorded]:
    """The migrations the database records (none before the first)."""
    exists = await conn.fetchval("SELECT to_regclass('yoke_schema_version') IS NOT NULL")
    if not exists:
        return {}
    checksums = await _has_checksums(conn)
    rows = await conn.fetch(
        "SELECT version, name, " + ("checksum" if checksums else "NULL") + " FROM yoke_schema_version"
    )
    return {r[0]: Recorded(r[1], r[2]) for r in rows}


async def applied_versions(conn: asyncpg.Connection) -> set[int]:
    return set(await recorded(conn))


async def _has_checksums(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'yoke_schema_version'::regclass"
        " AND attname = 'checksum' AND NOT attisdropped)"
    ))


async def _prepare_table(conn: asyncpg.Connection) -> bool:
    """Create ``yoke_schema_version`` if missing, add the checksum column to
    one made by an older version; whether checksums can be kept. Nothing is
    changed when nothing needs to be: a login that may not create or alter
    tables (the runtime role on a database migrated before) passes."""
    if not await conn.fetchval("SELECT to_regclass('yoke_schema_version') IS NOT NULL"):
        await conn.execute(
            "CREATE TABLE yoke_schema_version ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(), checksum text)"
        )
        return True
    if await _has_checksums(conn):
        return True
    try:
        await conn.execute("ALTER TABLE yoke_schema_version ADD COLUMN checksum text")
    except asyncpg.InsufficientPrivilegeError:
        return False  # names are still checked
    return True


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied by this call.
    ``SchemaMismatch`` when the database records other migrations under
    this version's numbers, ``SchemaNewer`` when it records migrations of a
    newer build."""
    done: list[str] = []
    files = migrations()
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        checksums = await _prepare_table(conn)
        seen = await recorded(conn)
        check_startable(schema_status(seen, files), migrated=True)  # a newer build's schema: refused
        for m in files:
            if m.version in seen:
                if checksums and seen[m.version].checksum is None:
                    # Recorded (under this name) before checksums were kept:
                    # from now on its text is checked too.
                    try:
                        await conn.execute(
                            "UPDATE yoke_schema_version SET checksum = $2"
                            " WHERE version = $1 AND checksum IS NULL",
                            m.version, m.checksum,
                        )
                    except asyncpg.InsufficientPrivilegeError:
                        pass  # a login that may not: the owner will
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                if checksums:
                    await conn.execute(
                        "INSERT INTO yoke_schema_version (version, name, checksum) VALUES ($1, $2, $3)",
                        m.version, m.name, m.checksum,
                    )
                else:
                    await conn.execute(
                        "INSERT INTO yoke_schema_version (version, name) VALUES ($1, $2)", m.version, m.name
                    )
            done.append(m.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return done


async def status(conn: asyncpg.Connection) -> Status:
    """Applied, pending and newer migrations; changes nothing (``yoke
    migrate --status``, and the start of a process that does not migrate)."""
    return schema_status(await recorded(conn), migrations())


async def pending(conn: asyncpg.Connection) -> list[str]:
    """Migrations not applied yet; ``SchemaMismatch`` when the recorded ones
    are not this version's."""
    files = migrations()
    seen = await recorded(conn)
    check_recorded(seen, files)
    return [m.name for m in files if m.version not in seen]


# --- the runtime role (roles.py) ---------------------------------------------


async def sync_role(conn: asyncpg.Connection, role: str, password: str = "", *, set_password: bool = False) -> list[str]:
    """As the owner: create ``role`` if missing and give it this build's
    grants (``roles.sync``), in the migration lock."""
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        return await roles.sync(conn, role, migrations(), password=password, set_password=set_password)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def grant_statements(conn: asyncpg.Connection, role: str) -> list[str]:
    """What ``role`` needs to be this database's runtime role (``yoke
    migrate --print-grants``)."""
    return await roles.grant_statements(conn, role, migrations())


async def missing_grants(conn: asyncpg.Connection) -> list[str]:
    """The grants this connection's login lacks to run Yoke."""
    return await roles.missing(conn, await conn.fetchval("SELECT session_user"), migrations())


async def privilege_hint(conn: asyncpg.Connection, exc: asyncpg.InsufficientPrivilegeError) -> str:
    """One line for a login refused while migrating: it lacks the runtime's
    grants on a migrated database, or it may not migrate."""
    try:
        user = await conn.fetchval("SELECT session_user")
        migrated = await conn.fetchval("SELECT to_regclass('yoke_schema_version') IS NOT NULL")
        lacking = await missing_grants(conn) if migrated else []
    except Exception:  # the connection is gone with the error
        user, lacking = "this login", []
    if lacking:
        return grants_hint(user, lacking)
    return (
        f"the PostgreSQL login {user} may not apply Yoke's migrations ({exc}): run `yoke migrate` as"
        " the database's owner first (it creates the tables and grants the runtime role what it"
        " needs), then start with the runtime role's login or with --no-migrate"
    )


def grants_hint(user: str, lacking: list[str]) -> str:
    return (
        f"the PostgreSQL runtime login {user} lacks {len(lacking)} grant(s) Yoke needs (the first:"
        f" {lacking[0]}): run `yoke migrate` as the database's owner with YOKE_PG_ROLE={user}, which grants"
        f" them, or have them granted: `YOKE_PG_ROLE={user} yoke migrate --print-grants` prints them"
    )
