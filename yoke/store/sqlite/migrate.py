"""SQLite's numbered migrations: which ones a file holds, and applying the
rest (on the writer's connection, when the store opens).

``PRAGMA user_version`` keeps only the newest number, so each migration is
also recorded by name and checksum (as on PostgreSQL) and checked against
the files before anything is applied.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..schema import Migration, Recorded, Status, check_startable, read_migrations
from ..schema import status as schema_status

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS yoke_schema_version ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT, applied_at INTEGER NOT NULL)"
)


def migrations() -> list[Migration]:
    return read_migrations(__package__)


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def recorded(conn: sqlite3.Connection) -> dict[int, Recorded]:
    if conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'yoke_schema_version'"
    ).fetchone() is None:
        return {}
    return {
        r[0]: Recorded(r[1], r[2])
        for r in conn.execute("SELECT version, name, checksum FROM yoke_schema_version")
    }


def migration_status(conn: sqlite3.Connection) -> Status:
    """Applied, pending and newer migrations of the file; changes nothing.
    A file migrated before names were recorded counts the files up to its
    user_version as applied (the next migrating open records them)."""
    seen = recorded(conn)
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    if current and not seen:
        seen = {m.version: Recorded(m.name, None) for m in migrations() if m.version <= current}
    return schema_status(seen, migrations())


def migrate(conn: sqlite3.Connection, now_ms: Callable[[], int]) -> None:
    """Apply the pending migrations, each in its own transaction (``now_ms``:
    the store's clock, for the time each is recorded as applied)."""
    files = migrations()
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    seen = recorded(conn)
    if current and not seen:
        # Migrated before names were recorded: take the files up to
        # user_version as the ones applied (they cannot be checked), so
        # that from now on every migration is.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(VERSION_TABLE)
            conn.executemany(
                "INSERT OR IGNORE INTO yoke_schema_version VALUES (?, ?, ?, ?)",
                [(m.version, m.name, m.checksum, now_ms()) for m in files if m.version <= current],
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        seen = recorded(conn)
    check_startable(schema_status(seen, files), migrated=True)  # a newer build's file: refused
    for m in files:
        if m.version <= current:
            continue
        # The version's row is written first, under the write lock: a process
        # that opened the same file at the same moment and applied it already
        # makes this insert fail, and the migration is not run twice.
        try:
            conn.executescript(
                f"BEGIN IMMEDIATE;\n{VERSION_TABLE};\n"
                f"INSERT INTO yoke_schema_version VALUES ({m.version}, {_sql_text(m.name)},"
                f" {_sql_text(m.checksum)}, {now_ms()});\n"
                f"{m.sql}\n;PRAGMA user_version = {m.version};\nCOMMIT;"
            )
        except sqlite3.IntegrityError:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if recorded(conn).get(m.version) != Recorded(m.name, m.checksum):
                raise
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
