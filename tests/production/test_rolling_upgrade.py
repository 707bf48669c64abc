"""A rolling upgrade of a running fleet (docs/production/upgrades.md), as an
operator does it: `yoke serve --no-executor` twice (a load balancer's view:
the client fails over between them) and two `yoke worker`s on PostgreSQL run
the OLD build; `yoke migrate` with the new build while they run; then each
process replaced by the new build (`--no-migrate`), one at a time, under
load. Nothing lost, nothing counted twice, no error answered or logged.

The old build is real: this repository at the commit before the newest
PostgreSQL migration was added (`git archive`), so the test checks what
Yoke promises, that each migration keeps the build before it working."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tarfile
import io
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import yoke
from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
from tests.http.conftest import Server, run_apart, start_server, stop_server
from tests.production.test_backup_sqlite import KEYS, events, instances, wait_idle
from yoke.store.postgres.migrate import migrations

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.production.backup_app:app"
KNOWN_RESET = "ERROR asyncio: Resetting connection with an active transaction"
FAST = {"YOKE_SCHEDULER_SWEEP_S": "0.05", "YOKE_WORKER_HEARTBEAT_S": "0.2", "YOKE_ACCESS_LOG": "0"}


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


@pytest.fixture(scope="module")
def old_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The yoke package as it was before the newest PostgreSQL migration."""
    newest = migrations()[-1].name
    added = git("log", "-1", "--format=%H", "--diff-filter=A", "--", f"yoke/store/postgres/migrations/{newest}")
    commit = added.stdout.decode().strip()
    if added.returncode != 0 or not commit:
        pytest.skip(f"no git history here to find the build before {newest} (a shallow clone?)")
    archive = git("archive", f"{commit}^", "yoke")
    assert archive.returncode == 0, archive.stderr
    where = tmp_path_factory.mktemp("old-build")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    assert not (where / "yoke/store/postgres/migrations" / newest).exists()
    return where


def env_for(build: Path | None) -> dict[str, str]:
    """PYTHONPATH: the build's yoke first (the old one), then this repository (the tests' app)."""
    paths = [str(build)] if build is not None else []
    return {**FAST, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}


class Worker:
    def __init__(self, db_url: str, build: Path | None, log: Path, *args: str) -> None:
        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("YOKE_")},
                       **env_for(build), "YOKE_DATABASE_URL": db_url}
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", "worker", "--app", APP, "--json", *args], env=environment,
            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, cwd=log.parent,
        )
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        assert ready, f"the worker printed nothing: {log.read_text()}"
        self.worker_id = json.loads(self.process.stdout.readline())["worker_id"]

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


class FailoverLoad:
    """Appends ticks one after another through whichever server answers,
    like a client behind a load balancer: a refused connection goes to the
    next server with the same idempotency key; any HTTP answer but 201 is
    an error."""

    def __init__(self, token: str) -> None:
        self.urls: list[str] = []
        self.token = token
        self.sent = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        turn = 0
        with httpx.Client(headers={"Authorization": f"Bearer {self.token}"}, timeout=30) as http:
            while not self.stop.is_set():
                i = self.sent
                body = {"type": "tick", "payload": {"k": i % KEYS, "i": i}, "idempotency_key": f"tick-{i}"}
                turn += 1
                url = self.urls[turn % len(self.urls)]
                try:
                    r = http.post(url + "/v1/streams/ticks/-/events", json=body)
                except httpx.TransportError:
                    continue  # that server is being replaced: the next one, same key
                with self.changed:
                    if r.status_code != 201:
                        self.errors.append(f"{url}: {r.status_code} {r.text}")
                    self.sent += 1
                    self.changed.notify_all()

    def progress(self, n: int) -> None:
        """Wait until ``n`` more ticks went through (or one failed)."""
        with self.changed:
            target = self.sent + n
            assert self.changed.wait_for(lambda: self.sent >= target or self.errors, 120), (self.sent, target)
        assert not self.errors, self.errors


@pytest.fixture
def database() -> Iterator[str]:
    name = f"yoke_upgrade_{uuid.uuid4().hex[:10]}"
    run_apart(admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        run_apart(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_rolling_upgrade_of_a_running_fleet(old_build, database, tmp_path):
    newest = migrations()[-1].name
    servers: list[Server] = []
    workers: list[Worker] = []
    logs: list[Path] = []

    def serve(build: Path | None, n: int, *args: str) -> Server:
        server = start_server(database, tmp_path / f"s{n}" / ".yoke", args=("--no-executor", *args), **env_for(build))
        logs.append(server.data_dir.parent / f"server-{server.url.rsplit(':', 1)[1]}.log")
        return server

    def work(build: Path | None, n: int, *args: str) -> Worker:
        logs.append(tmp_path / f"worker-{n}.log")
        return Worker(database, build, logs[-1], *args)

    for n in (1, 2):
        (tmp_path / f"s{n}").mkdir()
        servers.append(serve(old_build, n))
    assert newest in yoke("migrate", "--status", cwd=tmp_path, YOKE_DATABASE_URL=database).stdout.split("pending:")[1]
    workers += [work(old_build, 1), work(old_build, 2)]
    load = FailoverLoad(servers[0].token)
    load.urls[:] = [s.url for s in servers]
    load.thread.start()
    try:
        load.progress(2 * KEYS)
        # 1. The new build's migrations, while the old fleet runs.
        applied = yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=database).stdout
        assert f"applied {newest}" in applied
        load.progress(50)  # the old build on the new schema
        # 2. Each process replaced, one at a time.
        for n in (1, 2):
            assert workers[n - 1].stop() == 0
            workers[n - 1] = work(None, n + 2, "--no-migrate")
            load.progress(50)
        for n in (1, 2):
            old = servers[n - 1]
            load.urls[:] = [s.url for s in servers if s is not old]
            assert stop_server(old) == -signal.SIGTERM  # a clean stop, as one process ends on SIGTERM
            (tmp_path / f"s{n + 2}").mkdir()
            servers[n - 1] = serve(None, n + 2, "--no-migrate")
            load.urls[:] = [s.url for s in servers]
            load.progress(50)
    finally:
        load.stop.set()
        load.thread.join(30)
    assert not load.errors, load.errors

    try:
        with servers[0].client() as http:
            ticks = [t for t in events(http, "/ticks") if t["type"] == "tick"]
            assert sorted(t["payload"]["i"] for t in ticks) == list(range(load.sent))  # each once, none lost
            wait_idle(http, len(ticks))
            per_key = Counter(t["payload"]["k"] for t in ticks)
            [stats] = instances(http, "stats")
            assert stats["state"]["value"] == {"n": len(ticks)}
            for c in instances(http, "counter"):
                k = int(c["key"])
                assert c["state"]["value"] == {"n": per_key[k]}, c
                assert [e["payload"]["n"] for e in events(http, f"/counted/{k}")] == list(range(1, per_key[k] + 1))
            assert http.get("/v1/overview").json()["queue"]["dead"] == 0
    finally:
        for worker in workers:
            assert worker.stop() == 0
        for server in servers:
            stop_server(server)
    status = json.loads(yoke("migrate", "--status", "--json", cwd=tmp_path, YOKE_DATABASE_URL=database).stdout)
    assert status["pending"] == [] and status["newer"] == []
    for log in logs:
        # One known line aside: asyncpg's "Resetting connection with an active
        # transaction" when a worker stops (issue 40, finding 2: fixed apart
        # from this test, and the old build from git keeps it forever).
        text = "\n".join(line for line in log.read_text().splitlines() if KNOWN_RESET not in line)
        assert "Traceback" not in text and "ERROR" not in text and " WARNING " not in text, f"{log}:\n{text}"
