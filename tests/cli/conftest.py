"""The ``yoke`` CLI as a user runs it: a subprocess in a directory where a
real ``yoke serve`` runs, no YOKE_* variable inherited from the test
process, and the token found the way the CLI finds it (``.yoke/token-PORT``)
unless a test passes one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.conftest import Server, own_database, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.http.actor_app:app"
FAST = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "YOKE_SCHEDULER_SWEEP_S": "0.05",
    "YOKE_WORKER_HEARTBEAT_S": "0.2",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOKE_")}
    env["COLUMNS"] = "120"
    env.update(extra)
    return env


def yoke(*args: str, cwd: Path, check: bool = True, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """``yoke ARGS`` in ``cwd``; ``check``: exit status 0 or an assertion
    error that shows both outputs."""
    done = subprocess.run(
        [sys.executable, "-m", "yoke.cli", *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"yoke {' '.join(args)} exited {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        )
    return done


class Cli:
    """The CLI in the directory of ``server`` (cwd = the parent of its .yoke)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.cwd = server.data_dir.parent

    def __call__(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        return yoke(*args, "--url", self.server.url, cwd=self.cwd, check=check, **env)

    def db(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        """A database command (tokens, migrate, demo) on the server's database."""
        return yoke(*args, cwd=self.cwd, check=check, YOKE_DATABASE_URL=self.server.db_url, **env)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A SQLite server running the test actors, data under <tmp>/.yoke."""
    base = tmp_path_factory.mktemp("cli")
    srv = start_server(f"sqlite:///{base}/yoke.db", base / ".yoke", args=("--app", APP), **FAST)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def any_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A plain server on each backend."""
    base = tmp_path_factory.mktemp("cli-backend")
    with own_database(request.param, base, "yoke_cli") as db_url:
        srv = start_server(db_url, base / ".yoke")
        try:
            yield srv
        finally:
            stop_server(srv)


@pytest.fixture
def cli(server: Server) -> Cli:
    return Cli(server)
