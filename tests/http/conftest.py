"""A real ``yoke serve`` process per backend, and clients that talk to it."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest


# Not the module `random`: a plugin that seeds it per test would give every
# parallel worker the same sequence.
_PORTS = random.SystemRandom()


def free_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is in its ephemeral range, so
    between this check and the server's own bind any outgoing connection of a
    parallel test (a PostgreSQL client, say) could take it as its source port;
    a suite run lost a server to that. Ports below the range are never taken
    that way, and a random pick keeps parallel workers apart.
    """
    while True:
        port = _PORTS.randrange(15000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@dataclass
class Server:
    url: str
    db_url: str
    data_dir: Path
    token: str
    process: subprocess.Popen

    @property
    def token_file(self) -> Path:
        """The admin token file this server wrote (``yoke serve`` keys it by port)."""
        return self.data_dir / f"token-{self.url.rsplit(':', 1)[1]}"

    def client(self, token: str | None = None) -> httpx.Client:
        token = self.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "YOKE_DATABASE_URL": self.db_url, "YOKE_TOKEN": self.token}
        return subprocess.run(
            [sys.executable, "-m", "yoke.cli", *args], env=env, capture_output=True, text=True, timeout=60,
            check=check, cwd=self.data_dir.parent,
        )

    def new_token(self, tenant: str, scopes: str) -> str:
        out = self.cli("tokens", "create", "--tenant", tenant, "--scopes", scopes, "--json")
        return orjson.loads(out.stdout)["token"]


def start_server(db_url: str, data_dir: Path, *, args: tuple[str, ...] = (), **env: str) -> Server:
    """``yoke serve [args]`` on ``db_url`` with its data under ``data_dir``."""
    port = free_port()
    environment = {
        **os.environ,
        "YOKE_DATABASE_URL": db_url,
        "YOKE_DATA_DIR": str(data_dir),
        "YOKE_PORT": str(port),
        "YOKE_PRUNE_INTERVAL_S": "0.2",
        "YOKE_SSE_HEARTBEAT_S": "0.5",
        "YOKE_ACCESS_LOG": "0",
        **env,
    }
    log = open(data_dir.parent / f"server-{port}.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "serve", *args], env=environment, stdout=log, stderr=subprocess.STDOUT,
        cwd=data_dir.parent,
    )
    url = f"http://127.0.0.1:{port}"
    token_file = data_dir / f"token-{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"yoke serve exited: {(data_dir.parent / f'server-{port}.log').read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200 and token_file.exists():
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("yoke serve did not become ready")
        time.sleep(0.05)
    return Server(url, db_url, data_dir, token_file.read_text().strip(), process)


def stop_server(server: Server) -> int:
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("server")
    if request.param == "sqlite":
        db_url = f"sqlite:///{base}/yoke.db"
    else:
        db_url = request.getfixturevalue("pg_url")
    srv = start_server(db_url, base / ".yoke")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def path() -> str:
    """A stream path of its own per test (all tests share the server's tenant)."""
    import uuid

    return "/t/" + uuid.uuid4().hex[:12]


def events_url(path: str, action: str = "events") -> str:
    return f"/v1/streams{path}/-/{action}"


@contextlib.contextmanager
def own_database(kind: str, base: Path, prefix: str) -> Iterator[str]:
    """A database of its own: a SQLite file under ``base``, or a new
    PostgreSQL database (``yoke serve`` migrates it on start), dropped after."""
    from tests.conftest import PG_ADMIN_URL, admin_sql, with_database

    if kind == "sqlite":
        yield f"sqlite:///{base}/yoke.db"
        return
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    run_apart(admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        run_apart(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def run_apart(coroutine: Any) -> Any:
    """``asyncio.run`` on a thread of its own: callable while this thread runs
    an event loop (Playwright's sync API keeps one running in the browser tests)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


ROOT = Path(__file__).resolve().parents[2]
CONSOLE_APP = "tests.http.console_app:app"
# Fast actor retries and schedules, fast subscription retries (a failing webhook halts at once).
CONSOLE_FAST = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "YOKE_SCHEDULER_SWEEP_S": "0.05",
    "YOKE_WORKER_HEARTBEAT_S": "0.2",
    "YOKE_SUBSCRIPTION_RETRY_BASE_S": "0.01",
    "YOKE_SUBSCRIPTION_RETRY_MAX_S": "0.02",
    "YOKE_METRICS_SAMPLE_S": "0.1",
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def console_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``yoke serve --app tests.http.console_app:app`` on a database of its own."""
    base = tmp_path_factory.mktemp("console")
    with own_database(request.param, base, "yoke_console") as db_url:
        # --print-token: the console's sign-in link is printed off a terminal too (the tests read it).
        srv = start_server(db_url, base / ".yoke", args=("--app", CONSOLE_APP, "--print-token"), **CONSOLE_FAST)
        try:
            yield srv
        finally:
            stop_server(srv)
