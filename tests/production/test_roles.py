"""The PostgreSQL runtime role: chosen per database, created and granted by
the owner's ``yoke migrate``, its grants printable; one-line errors for a
login that may not migrate or lacks grants; connections named by process
kind, with the statement timeout set."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

import yoke
from tests.cli.conftest import yoke as run_yoke
from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
from tests.http.conftest import run_apart, start_server, stop_server
from yoke.store.postgres.store import with_user


@pytest.fixture
def database(roles: list[str]) -> Iterator[str]:
    """A database of the test's own, dropped before its roles."""
    name = f"yoke_roles_{uuid.uuid4().hex[:12]}"
    run_apart(admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        run_apart(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def roles() -> Iterator[list[str]]:
    """Role names for the test (cluster-wide: dropped after its database)."""
    made = [f"yoke_rt_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    yield made
    for role in made:
        run_apart(admin_sql(f'DROP ROLE IF EXISTS "{role}"'))


async def fetch(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def scram_matches(verifier: str, password: str) -> bool:
    """PostgreSQL's check of a SCRAM-SHA-256 verifier against a password."""
    method, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored, _server = keys.split(":")
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return method == "SCRAM-SHA-256" and hashlib.sha256(client_key).digest() == base64.b64decode(stored)


def test_a_runtime_role_of_the_databases_own(database, roles, tmp_path):
    """Today YOKE_PG_ROLE=other failed (permission denied for table
    yoke_relay): the migrations granted yoke_runtime only."""
    role, other = roles
    done = run_yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=database, YOKE_PG_ROLE=role,
                    YOKE_PG_ROLE_PASSWORD="correct horse")
    assert f'CREATE ROLE "{role}" LOGIN PASSWORD ***;' in done.stdout and "correct horse" not in done.stdout
    [row] = run_apart(fetch(PG_ADMIN_URL, "SELECT rolpassword, rolsuper, rolbypassrls FROM pg_authid"
                                          " WHERE rolname = $1", role))
    assert scram_matches(row["rolpassword"], "correct horse") and not row["rolsuper"] and not row["rolbypassrls"]
    # yoke_runtime, shared by every database on the cluster, keeps nothing here.
    [held] = run_apart(fetch(database, "SELECT has_table_privilege('yoke_runtime', 'events', 'SELECT'),"
                                       " has_table_privilege($1, 'events', 'SELECT'),"
                                       " has_function_privilege('yoke_runtime', 'yoke_find_token(text)', 'EXECUTE')",
                             role))
    assert tuple(held) == (False, True, False)
    # Migrating again changes nothing but the password (set again, rotated).
    again = run_yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=database, YOKE_PG_ROLE=role,
                     YOKE_PG_ROLE_PASSWORD="battery staple")
    assert again.stdout.splitlines() == [f'ALTER ROLE "{role}" PASSWORD ***;']

    # The owner's URL and the role's name: the server hands over to the role.
    server = start_server(database, tmp_path / ".yoke", YOKE_PG_ROLE=role, YOKE_PG_ROLE_PASSWORD="battery staple")
    try:
        with server.client() as http:
            assert http.post("/v1/streams/roles/-/events", json={"type": "t"}).status_code == 201
            assert [e["type"] for e in http.get("/v1/streams/roles/-/events").json()["events"]] == ["t"]
        sessions = run_apart(fetch(PG_ADMIN_URL, "SELECT usename, application_name FROM pg_stat_activity"
                                                 " WHERE datname = $1 AND pid <> pg_backend_pid()",
                                   database.rsplit("/", 1)[1]))
        assert sessions and {(s["usename"], s["application_name"]) for s in sessions} == {(role, "yoke serve")}
    finally:
        stop_server(server)

    # --print-grants for another role, applied by hand (psql): it runs Yoke.
    printed = run_yoke("migrate", "--print-grants", cwd=tmp_path, YOKE_DATABASE_URL=database,
                       YOKE_PG_ROLE=other).stdout
    assert printed.startswith(f'GRANT CONNECT ON DATABASE "{database.rsplit("/", 1)[1]}" TO "{other}";')
    run_apart(admin_sql(f'CREATE ROLE "{other}" LOGIN'))
    subprocess.run(["psql", database, "-v", "ON_ERROR_STOP=1", "-q"], input=printed, text=True, check=True)
    server = start_server(with_user(database, other), tmp_path / ".yoke2")
    try:
        with server.client() as http:
            assert http.post("/v1/streams/roles/-/events", json={"type": "u"}).status_code == 201
    finally:
        stop_server(server)


def test_logins_that_cannot_run_yoke_get_one_line(database, roles, tmp_path):
    """Today: a 96-line traceback for the runtime role on an empty database."""
    role, _ = roles
    run_apart(admin_sql(f'CREATE ROLE "{role}" LOGIN'))
    env = {"YOKE_DATA_DIR": str(tmp_path / ".yoke")}
    done = run_yoke("serve", "--port", "0", cwd=tmp_path, check=False,
                    YOKE_DATABASE_URL=with_user(database, role), **env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"the PostgreSQL login {role} may not apply Yoke's migrations" in done.stderr
    assert "run `yoke migrate` as the database's owner first" in done.stderr
    # Migrated for yoke_runtime: this login has none of the grants.
    run_yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=database)
    done = run_yoke("worker", "--app", "tests.http.actor_app:app", cwd=tmp_path, check=False,
                    YOKE_DATABASE_URL=with_user(database, role), PYTHONPATH=str(Path.cwd()), **env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"the PostgreSQL runtime login {role} lacks" in done.stderr
    assert f"YOKE_PG_ROLE={role} yoke migrate --print-grants" in done.stderr


async def test_connections_carry_the_name_and_the_statement_timeout(database):
    async with yoke.open(database, executor=False, pg_statement_timeout_s=0.25,
                         pg_application_name="yoke test") as y:
        async with y.store.pool.acquire() as conn:
            assert await conn.fetchval("SHOW statement_timeout") == "250ms"
            assert await conn.fetchval("SHOW application_name") == "yoke test"
            with pytest.raises(asyncpg.QueryCanceledError):
                await conn.execute("SELECT pg_sleep(1)")
        listening = await fetch(PG_ADMIN_URL, "SELECT application_name FROM pg_stat_activity"
                                              " WHERE datname = $1 AND query LIKE 'LISTEN%'",
                                database.rsplit("/", 1)[1])
        assert [r[0] for r in listening] == ["yoke test"]
    async with yoke.open(database, executor=False) as y:  # no timeout unless asked
        async with y.store.pool.acquire() as conn:
            assert await conn.fetchval("SHOW statement_timeout") == "0"
    await asyncio.sleep(0)


def test_a_role_outlives_its_databases_until_removed_as_documented(database, roles, tmp_path):
    """Roles are cluster-wide: dropping a Yoke database leaves its runtime
    role, and DROP ROLE refuses while another database still grants it.
    docs/production/roles.md's removal: DROP OWNED BY in each database left
    (the role owns nothing there: this takes its grants back), then DROP ROLE."""
    role = roles[0]
    second = with_database(PG_ADMIN_URL, f"yoke_roles_{uuid.uuid4().hex[:12]}")
    run_apart(admin_sql(f'CREATE DATABASE "{second.rsplit("/", 1)[1]}"'))
    try:
        for url in (database, second):
            run_yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=url, YOKE_PG_ROLE=role)
        run_apart(admin_sql(f'DROP DATABASE "{database.rsplit("/", 1)[1]}" WITH (FORCE)'))
        assert run_apart(fetch(PG_ADMIN_URL, "SELECT 1 FROM pg_roles WHERE rolname = $1", role))  # still there
        with pytest.raises(asyncpg.exceptions.DependentObjectsStillExistError):
            run_apart(admin_sql(f'DROP ROLE "{role}"'))  # the second database grants it
        run_apart(fetch(second, f'DROP OWNED BY "{role}"'))
        run_apart(admin_sql(f'DROP ROLE "{role}"'))
        assert not run_apart(fetch(PG_ADMIN_URL, "SELECT 1 FROM pg_roles WHERE rolname = $1", role))
        [left] = run_apart(fetch(second, "SELECT count(*) FROM yoke_schema_version"))
        assert left[0] > 0  # the database's own data is untouched
    finally:
        run_apart(admin_sql(f'DROP DATABASE IF EXISTS "{second.rsplit("/", 1)[1]}" WITH (FORCE)'))
