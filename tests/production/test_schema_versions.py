"""What a process does with the schema it finds: ``yoke migrate --status``,
``--no-migrate``, and a database migrated by a newer build (refused at start),
on both backends, through the real CLI."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from tests.cli.conftest import yoke
from tests.http.conftest import own_database, start_server, stop_server
from yoke.store.postgres.migrate import migrations as pg_migrations
from yoke.store.sqlite.migrate import migrations as sqlite_migrations

FUTURE = "9999_from_a_newer_build.sql"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path):
    with own_database(request.param, tmp_path, "yoke_schema") as url:
        yield url


def files(url: str) -> list[str]:
    found = sqlite_migrations() if url.startswith("sqlite") else pg_migrations()
    return [m.name for m in found]


def record_future(url: str) -> None:
    """What a newer build's ``yoke migrate`` leaves: one more migration recorded."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        conn.execute("INSERT INTO yoke_schema_version VALUES (9999, ?, NULL, 0)", (FUTURE,))
        conn.execute("PRAGMA user_version = 9999")
        conn.commit()
        conn.close()
        return

    async def insert() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO yoke_schema_version (version, name) VALUES (9999, $1)", FUTURE)
        finally:
            await conn.close()

    asyncio.run(insert())


def status(url: str, cwd: Path) -> dict:
    return json.loads(yoke("migrate", "--status", "--json", cwd=cwd, YOKE_DATABASE_URL=url).stdout)


def test_migrate_status_lists_applied_pending_and_newer(db_url, tmp_path):
    names = files(db_url)
    before = status(db_url, tmp_path)
    assert (before["applied"], before["pending"], before["newer"]) == ([], names, [])
    assert before["build"].startswith("0.")
    text = yoke("migrate", "--status", cwd=tmp_path, YOKE_DATABASE_URL=db_url).stdout
    assert "pending:" in text and names[-1] in text and "`yoke migrate` applies" in text
    yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=db_url)
    after = status(db_url, tmp_path)
    assert (after["applied"], after["pending"], after["newer"]) == (names, [], [])
    record_future(db_url)
    newer = status(db_url, tmp_path)
    assert (newer["applied"], newer["pending"], newer["newer"]) == (names, [], [FUTURE])
    assert "refuses to start" in yoke("migrate", "--status", cwd=tmp_path, YOKE_DATABASE_URL=db_url).stdout


def test_a_newer_builds_schema_refuses_the_start(db_url, tmp_path):
    """Today's failure: a build that knew fewer migrations started on the
    newer schema, ready, without a word. Now serve, worker and migrate
    refuse, naming the migration they do not know."""
    yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=db_url)
    record_future(db_url)
    env = {"YOKE_DATABASE_URL": db_url, "YOKE_DATA_DIR": str(tmp_path / ".yoke")}
    for command in (("serve", "--port", "0"), ("worker", "--app", "tests.http.actor_app:app"), ("migrate",)):
        done = yoke(*command, cwd=tmp_path, check=False, timeout=60, PYTHONPATH=str(Path.cwd()), **env)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert f"schema_newer: the database was migrated by a newer Yoke: it records {FUTURE}" in done.stderr
        assert "Traceback" not in done.stderr


def test_no_migrate_refuses_pending_migrations_then_starts(db_url, tmp_path):
    env = {"YOKE_DATABASE_URL": db_url, "YOKE_DATA_DIR": str(tmp_path / ".yoke")}
    done = yoke("serve", "--port", "0", "--no-migrate", cwd=tmp_path, check=False, **env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "schema_pending:" in done.stderr and "run `yoke migrate` with this build first" in done.stderr
    assert "Traceback" not in done.stderr
    assert status(db_url, tmp_path)["applied"] == []  # nothing applied
    done = yoke("serve", "--port", "0", cwd=tmp_path, check=False, YOKE_MIGRATE="false", **env)
    assert done.returncode == 1 and "schema_pending:" in done.stderr  # the setting, too
    yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=db_url)
    server = start_server(db_url, tmp_path / ".yoke", args=("--no-migrate",))
    try:
        with server.client() as http:
            assert http.get("/readyz").json() == {"status": "ready"}
    finally:
        stop_server(server)


def test_migrate_refuses_a_role_flag_on_sqlite(tmp_path):
    done = yoke("migrate", "--print-grants", cwd=tmp_path, check=False,
                YOKE_DATABASE_URL=f"sqlite:///{tmp_path}/yoke.db")
    assert done.returncode == 1 and "--print-grants is for PostgreSQL" in done.stderr
