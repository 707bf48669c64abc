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


# --- the recorded migrations must be this version's files ----------------------


async def test_a_migration_recorded_under_another_name_fails_fast(fresh_db):
    """A database migrated with an older file of the same number (renamed
    or renumbered since) must not skip the new one silently: migrate, pending
    (/readyz) and opening the runtime all refuse, naming both files."""
    import yoke
    from yoke import errors

    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate.migrate(conn)
        newest = migrate.migrations()[-1]
        await conn.execute("UPDATE yoke_schema_version SET name = $2 WHERE version = $1",
                           newest.version, f"{newest.version:04d}_an_older_file.sql")
        for call in (migrate.migrate(conn), migrate.pending(conn)):
            with pytest.raises(errors.SchemaMismatch) as caught:
                await call
            assert f"{newest.version:04d}_an_older_file.sql" in caught.value.message
            assert newest.name in caught.value.message
        # The lock was let go: another session can take it at once.
        other = await asyncpg.connect(fresh_db)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", migrate.MIGRATION_LOCK_KEY)
        finally:
            await other.close()
    finally:
        await conn.close()
    with pytest.raises(errors.SchemaMismatch):
        async with yoke.open(fresh_db, executor=False):
            pass


async def test_an_older_file_of_the_same_number_is_not_skipped(fresh_db, monkeypatch):
    """The reviewer's case: the database was migrated when migration N was
    another file; this version's N would have been skipped."""
    from yoke import errors
    from yoke.store.schema import Migration

    files = migrate.migrations()
    older = [*files[:-1], Migration(files[-1].version, f"{files[-1].version:04d}_since_renumbered.sql",
                                    "SELECT 1")]
    conn = await asyncpg.connect(fresh_db)
    try:
        monkeypatch.setattr(migrate, "migrations", lambda: older)
        assert await migrate.migrate(conn) == [m.name for m in older]
        monkeypatch.undo()
        with pytest.raises(errors.SchemaMismatch) as caught:
            await migrate.migrate(conn)
        assert "since_renumbered" in caught.value.message and files[-1].name in caught.value.message
    finally:
        await conn.close()


async def test_an_edited_migration_and_a_missing_number_fail_fast(fresh_db, monkeypatch):
    from yoke import errors

    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate.migrate(conn)
        await conn.execute("UPDATE yoke_schema_version SET checksum = repeat('0', 64) WHERE version = 2")
        with pytest.raises(errors.SchemaMismatch) as caught:
            await migrate.migrate(conn)
        assert "0002_actors.sql was applied from a different text" in caught.value.message
        await conn.execute("UPDATE yoke_schema_version SET checksum = NULL WHERE version = 2")
        assert await migrate.migrate(conn) == []  # filled in again from the file
        # A number the database holds but this version has no file for (below
        # its newest): renumbered. Above its newest: a newer version's, refused
        # (tests/production/test_schema_versions.py), though /readyz's check
        # (pending) still passes: a running process serves on.
        files = migrate.migrations()
        monkeypatch.setattr(migrate, "migrations", lambda: [m for m in files if m.version != 3])
        with pytest.raises(errors.SchemaMismatch) as caught:
            await migrate.migrate(conn)
        assert "this Yoke has no migration 3" in caught.value.message
        monkeypatch.undo()
        await conn.execute("INSERT INTO yoke_schema_version (version, name) VALUES (9999, '9999_future.sql')")
        with pytest.raises(errors.SchemaNewer, match="9999_future.sql"):
            await migrate.migrate(conn)
        assert await migrate.pending(conn) == []
    finally:
        await conn.close()


async def test_a_version_table_without_checksums_gets_them(fresh_db):
    """A database migrated before checksums were kept: names are checked,
    the column is added and filled from the files (taken as applied)."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate.migrate(conn)
        await conn.execute("ALTER TABLE yoke_schema_version DROP COLUMN checksum")
        assert await migrate.migrate(conn) == []
        rows = await conn.fetch("SELECT version, name, checksum FROM yoke_schema_version ORDER BY version")
        assert [tuple(r) for r in rows] == [(m.version, m.name, m.checksum) for m in migrate.migrations()]
    finally:
        await conn.close()


def test_two_files_with_one_number_are_refused(tmp_path, monkeypatch):
    from yoke import errors
    from yoke.store import schema

    (tmp_path / "migrations").mkdir()
    for name in ("0001_a.sql", "0001_b.sql"):
        (tmp_path / "migrations" / name).write_text("SELECT 1;")
    monkeypatch.setattr(schema.resources, "files", lambda _package: tmp_path)
    with pytest.raises(errors.SchemaMismatch, match="two migrations numbered 1"):
        schema.read_migrations("whatever")


# --- SQLite: PRAGMA user_version holds a number only, so names are recorded too ---


def _sqlite(path):
    import sqlite3

    return sqlite3.connect(path, isolation_level=None)


async def test_sqlite_records_and_checks_its_migrations(tmp_path):
    import yoke
    from yoke import errors
    from yoke.store.sqlite.migrate import migrations as _migrations

    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}") as y:
        await y.ready()
    files = _migrations()
    db = _sqlite(path)
    try:
        rows = db.execute("SELECT version, name, checksum FROM yoke_schema_version ORDER BY version").fetchall()
        assert rows == [(m.version, m.name, m.checksum) for m in files]
        assert db.execute("PRAGMA user_version").fetchone()[0] == files[-1].version
        # Migrated when the newest number was another file: refused, not skipped.
        db.execute("UPDATE yoke_schema_version SET name = ? WHERE version = ?",
                   (f"{files[-1].version:04d}_since_renumbered.sql", files[-1].version))
    finally:
        db.close()
    with pytest.raises(errors.SchemaMismatch) as caught:
        async with yoke.open(f"sqlite:///{path}"):
            pass
    assert "since_renumbered" in caught.value.message and files[-1].name in caught.value.message
    db = _sqlite(path)
    try:
        db.execute("UPDATE yoke_schema_version SET name = ?, checksum = ? WHERE version = ?",
                   (files[-1].name, "0" * 64, files[-1].version))
    finally:
        db.close()
    with pytest.raises(errors.SchemaMismatch, match="applied from a different text"):
        async with yoke.open(f"sqlite:///{path}"):
            pass


async def test_sqlite_files_from_before_the_record_are_taken_as_applied(tmp_path):
    """A file migrated by an older Yoke (user_version only): the files up to
    its user_version are recorded on open, and checked from then on."""
    import yoke
    from yoke.store.sqlite.migrate import migrations as _migrations

    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}") as y:
        await y.stream("/s", tenant="t").append({"type": "x"})
    db = _sqlite(path)
    try:
        db.execute("DROP TABLE yoke_schema_version")
    finally:
        db.close()
    async with yoke.open(f"sqlite:///{path}") as y:
        await y.ready()
        assert [e.type for e in await y.stream("/s", tenant="t").read()] == ["x"]
    db = _sqlite(path)
    try:
        rows = db.execute("SELECT version, name, checksum FROM yoke_schema_version ORDER BY version").fetchall()
        assert rows == [(m.version, m.name, m.checksum) for m in _migrations()]
    finally:
        db.close()


# How to undo the migrations after 0014 that could not run twice (reopening
# the file applies them again) beyond the tables they create, which go too.
UNDO_LATER = {
    "0017_token_expiry.sql": "ALTER TABLE tokens DROP COLUMN expires_at",
    "0018_subscription_error_time.sql": "ALTER TABLE subscriptions DROP COLUMN last_error_at",
    "0020_actor_inputs.sql": "ALTER TABLE actor_instances DROP COLUMN inputs_incomplete",
}


def _undo_sqlite_migrations(path, since: str) -> None:
    """Return a file written by this Yoke to the layout it had before the
    migration named ``since`` (0013 or 0014): the table of events as those
    migrations found it (its rows keeping their row ids), no event_blocks,
    and the later migrations undone (UNDO_LATER). The store's code cannot
    write the old layouts any more; the migrations must still read them."""
    from yoke.store.sqlite.group_writes import INSERT_COLUMNS
    from yoke.store.sqlite.migrate import migrations as _migrations

    files = _migrations()
    cut = next(i for i, m in enumerate(files) if m.name == since)
    old = _sqlite(":memory:")
    for m in files[:cut]:
        old.executescript(m.sql)
    ddl = [r[0] for r in old.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'events' AND sql IS NOT NULL ORDER BY type DESC"
    )]
    old.close()
    # The tables of the migrations after 0014 go too: opening applies them again.
    blocks = next(i for i, m in enumerate(files) if m.name == "0014_event_blocks.sql")
    tables = []
    for upto in (blocks + 1, len(files)):
        db = _sqlite(":memory:")
        for m in files[:upto]:
            db.executescript(m.sql)
        tables.append({r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")})
        db.close()
    newer = tables[1] - tables[0]
    columns = ", ".join(INSERT_COLUMNS)
    keep_ids = "WITHOUT ROWID" not in ddl[0]
    db = _sqlite(path)
    try:
        db.execute("BEGIN")
        db.execute("DROP TABLE event_blocks")
        for sql in ddl:
            db.execute(sql)
        db.execute(
            f"INSERT INTO events ({'rowid, ' if keep_ids else ''}{columns})"
            f" SELECT {'row_id, ' if keep_ids else ''}{columns} FROM event_rows ORDER BY row_id"
        )
        db.execute("DROP TABLE event_rows")
        for table in sorted(newer):
            db.execute(f"DROP TABLE {table}")
        for m in files[cut + 1:]:
            if m.name in UNDO_LATER:
                db.execute(UNDO_LATER[m.name])
        db.execute("DELETE FROM yoke_schema_version WHERE version >= ?", (files[cut].version,))
        db.execute(f"PRAGMA user_version = {files[cut - 1].version}")
        db.execute("COMMIT")
    finally:
        db.close()


async def test_sqlite_events_move_to_a_rowid_table_unchanged(tmp_path):
    """Migration 0013 rebuilds the events table (a rowid table with its key
    as an index): every event of a file migrated before it reads back the
    same, stored idempotency keys still answer, offsets go on."""
    import yoke

    path = tmp_path / "yoke.db"
    shapes = [
        {"type": "plain", "payload": {"n": 1}},
        {"type": "full", "payload": [1, "two"], "source": {"app": "a"}, "correlation": "c", "group_id": "g",
         "metadata": {"m": 1}, "priority": 3, "idempotency_key": "k1"},
    ]
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        s = y.stream("/kept", tenant="t")
        first = await s.append_many(shapes + [{"type": "e", "payload": i} for i in range(40)])
        before = await s.read(limit=1000)
    _undo_sqlite_migrations(path, "0013_events_rowid.sql")
    db = _sqlite(path)
    try:
        assert "WITHOUT ROWID" in db.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    finally:
        db.close()
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        s = y.stream("/kept", tenant="t")
        assert await s.read(limit=1000) == before
        again = await s.append(shapes[1])  # the stored key answers with the original offset
        assert (again.offset, again.id) == (first[1].offset, first[1].id)
        assert (await s.append({"type": "next"})).offset == before[-1].offset + 1
    db = _sqlite(path)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "events" not in tables and {"event_rows", "event_blocks"} <= tables  # 0014 after 0013
        indexes = {r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'event_rows'"
        )}
        assert indexes == {"event_rows_idempotency"}  # offsets are found through event_blocks (0014)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()


def test_sqlite_processes_opening_a_new_file_together_migrate_it_once(tmp_path):
    """``yoke serve`` and ``yoke worker`` started at once on a new file: each
    migration runs once (the second waits on the write lock, then finds the
    version recorded), and both start."""
    from yoke.store.sqlite.migrate import migrations as _migrations

    path = tmp_path / "yoke.db"
    # Each process loads everything, says so, and opens when told: all at once.
    code = (
        "import asyncio, sys, yoke, yoke.runtime\n"
        "async def main():\n"
        f"    async with yoke.open({f'sqlite:///{path}'!r}) as y:\n"
        "        await y.ready()\n"
        "print('loaded', flush=True)\n"
        "sys.stdin.readline()\n"
        "asyncio.run(main())\n"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for run in runs:
        assert run.stdout.readline() == "loaded\n"
    for run in runs:
        run.stdin.write("go\n")
        run.stdin.flush()
    for run in runs:
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
    db = _sqlite(path)
    try:
        rows = db.execute("SELECT version FROM yoke_schema_version ORDER BY version").fetchall()
        assert [r[0] for r in rows] == [m.version for m in _migrations()]
    finally:
        db.close()
