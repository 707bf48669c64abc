"""The libpq URL forms Yoke takes for PostgreSQL: a multi-host list with
``target_session_attrs``, a Unix socket named in the query, and logins whose
passwords need quoting. The runtime role's connections (pool and LISTEN) are
made from the same URL with the login swapped (``with_user``), so each form
must survive that too; ``yoke serve`` is started with the multi-host form."""

from __future__ import annotations

import asyncio
import signal
import socket
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import pytest

import yoke
from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
from tests.http.conftest import start_server, stop_server
from yoke.store.postgres.store import with_user

SOCKET_DIR = "/var/run/postgresql"


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multi_host(url: str) -> str:
    """``url`` with an unreachable host listed before the real one."""
    parts = urlsplit(url)
    login, _, host = parts.netloc.rpartition("@")
    netloc = (f"{login}@" if login else "") + f"127.0.0.1:{closed_port()},{host}"
    return parts._replace(netloc=netloc, query="target_session_attrs=read-write").geturl()


def test_with_user_keeps_every_host_form() -> None:
    forms = {
        "postgresql://a:pw@h1:5432,h2:5433/db?target_session_attrs=read-write":
            "postgresql://r:s%2Fe%3Ac%40t@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "postgresql://a@[::1]:5433/db": "postgresql://r:s%2Fe%3Ac%40t@[::1]:5433/db",
        "postgresql:///db?host=/var/run/postgresql&user=a&password=x&sslmode=disable":
            "postgresql://r:s%2Fe%3Ac%40t@/db?host=%2Fvar%2Frun%2Fpostgresql&sslmode=disable",
    }  # fmt: skip
    for given, expected in forms.items():
        assert with_user(given, "r", "s/e:c@t") == expected
        assert parse_qs(urlsplit(expected).query).get("user") is None  # the query cannot log in as someone else


async def runtime_connections(database: str) -> dict[str, str]:
    """What each backend of ``database`` is, by user: the last statement's first word."""
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        rows = await conn.fetch(
            "SELECT usename, query FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", database
        )
    finally:
        await conn.close()
    return {f"{r['usename']}:{r['query'].split(' ', 1)[0].upper()}": r["usename"] for r in rows}


async def test_a_multi_host_url_reaches_the_live_host_for_every_connection(pg_url: str) -> None:
    url = multi_host(pg_url)
    database = urlsplit(pg_url).path.lstrip("/")
    async with yoke.open(url, executor=False) as y:
        stream = y.stream(f"/multi-host-{uuid.uuid4().hex[:6]}")
        await stream.append({"type": "probe.sent", "payload": {"n": 1}})
        assert [e.payload for e in await stream.read(after=0)] == [{"n": 1}]
        seen: set[str] = set()
        for _ in range(100):  # the listener connects in the background
            seen = set(await runtime_connections(database))
            if "yoke_runtime:LISTEN" in seen:
                break
            await asyncio.sleep(0.05)
        assert "yoke_runtime:LISTEN" in seen, seen  # the LISTEN connection is the runtime role's, on the live host


async def test_a_unix_socket_url_and_a_quoted_password(tmp_path: Path) -> None:
    if not Path(SOCKET_DIR, ".s.PGSQL.5432").exists():
        pytest.skip(f"no PostgreSQL socket in {SOCKET_DIR}")
    login, database = f"yoke_login_{uuid.uuid4().hex[:8]}", f"yoke_sock_{uuid.uuid4().hex[:8]}"
    password = "p@ss:w/rd%?#"
    await admin_sql(f"CREATE ROLE \"{login}\" LOGIN SUPERUSER PASSWORD '{password}'")
    await admin_sql(f'CREATE DATABASE "{database}"')
    try:
        url = with_user(f"postgresql:///{database}?host={SOCKET_DIR}", login, password)
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/by-socket")
            await stream.append({"type": "probe.sent", "payload": {"n": 2}})
            assert [e.payload for e in await stream.read(after=0)] == [{"n": 2}]
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin_sql(f'DROP ROLE IF EXISTS "{login}"')


def test_yoke_serve_starts_on_a_multi_host_url(tmp_path: Path) -> None:
    database = f"yoke_serve_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin_sql(f'CREATE DATABASE "{database}"'))
    try:
        (tmp_path / "data").mkdir()
        server = start_server(multi_host(with_database(PG_ADMIN_URL, database)), tmp_path / "data")
        try:
            headers = {"Authorization": f"Bearer {server.token}"}
            answer = httpx.post(server.url + "/v1/streams/multi/-/events", json={"type": "a", "payload": {}},
                                headers=headers)  # fmt: skip
            assert answer.status_code == 201, answer.text
            assert httpx.get(server.url + "/v1/streams/multi/-/events", headers=headers).json()["events"][0]["type"] == "a"
        finally:
            assert stop_server(server) == -signal.SIGTERM  # a clean stop, as one process ends on SIGTERM
    finally:
        asyncio.run(admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def test_each_host_of_a_multi_host_url_is_tried_on_its_own() -> None:
    """A connect timeout per host (pg_connect_timeout_s) needs the list
    split: asyncpg's one timeout covers every host, so a hung first host
    would hide the primary after it."""
    from yoke.store.postgres.connection import hosts_of

    assert hosts_of("postgresql://a:p%40w@h1:5432,[::1]:5433/db?target_session_attrs=read-write") == [
        "postgresql://a:p%40w@h1:5432/db?target_session_attrs=read-write",
        "postgresql://a:p%40w@[::1]:5433/db?target_session_attrs=read-write",
    ]
    # One host, or a list whose meaning is more than "each in turn, the first
    # writable wins" (hosts or ports in the query, load balancing, a
    # fallback to any host): left to asyncpg whole.
    for whole in ("postgresql://a@h1:5432/db", "postgresql:///db?host=/var/run/postgresql",
                  "postgresql://a@h1,h2/db?port=5432,5433",
                  "postgresql://a@h1:1,h2:2/db?load_balance_hosts=random",
                  "postgresql://a@h1:1,h2:2/db?target_session_attrs=prefer-standby"):
        assert hosts_of(whole) == [whole]


async def test_a_host_that_never_answers_is_passed_over(pg_url: str) -> None:
    """A listening socket that accepts and says nothing (a hung server) before
    the real one: the connection reaches the real one after the per-host timeout."""
    from yoke.store.postgres.connection import connect

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes handshakes; nobody ever answers
    try:
        parts = urlsplit(pg_url)
        login, _, host = parts.netloc.rpartition("@")
        url = parts._replace(netloc=f"{login}@127.0.0.1:{silent.getsockname()[1]},{host}").geturl()
        loop = asyncio.get_running_loop()
        started = loop.time()
        conn = await connect(url, timeout_s=0.5)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()
        assert 0.5 <= loop.time() - started < 5
    finally:
        silent.close()
