"""Metrics from every process, against real ``yoke serve`` and ``yoke worker``
processes: the documented split (``serve --no-executor`` + a worker with
``--metrics-port``) scrapes the actor and subscription series from the
worker; a subscription's series leave with it; ``/metrics`` answers from
memory while PostgreSQL is away (the sampled gauges keep their values and
say how old they are); the operations series (build, schema, pool, database
errors, heartbeats) are there."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from yoke.store.schema import read_migrations

from .conftest import ROOT, free_port, own_database, start_server, stop_server
from .test_actors_api import Tenant

APP = "tests.http.actor_app:app"
FAST = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "YOKE_SCHEDULER_SWEEP_S": "0.05",
    "YOKE_WORKER_HEARTBEAT_S": "0.2",
    "YOKE_SUBSCRIPTION_SWEEP_S": "0.1",
    "YOKE_METRICS_SAMPLE_S": "0.1",
}
DEADLINE_S = 30


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def value(text: str, series: str) -> float | None:
    """The value of one series (its full name and labels) in a scrape, or None."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def start_worker(db_url: str, base: Path, metrics_port: int, **env: str) -> subprocess.Popen:
    environment = {**os.environ, **FAST, "YOKE_DATABASE_URL": db_url, "YOKE_DATA_DIR": str(base / ".yoke"), **env}
    log = open(base / f"worker-{metrics_port}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "worker", "--app", APP, "--metrics-port", str(metrics_port)],
        env=environment, stdout=log, stderr=subprocess.STDOUT, cwd=base,
    )


def stop_worker(worker: subprocess.Popen) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_split_scrapes_actors_and_subscriptions_from_the_worker(kind: str, tmp_path: Path) -> None:
    with own_database(kind, tmp_path, "yoke_metrics_split") as db_url:
        server = start_server(db_url, tmp_path / ".yoke", args=("--app", APP, "--no-executor"), **FAST)
        port = free_port()
        worker = start_worker(db_url, tmp_path, port)
        scrape_url = f"http://127.0.0.1:{port}/metrics"
        try:
            t = Tenant(server)
            inst = t.create("counter", key="m")
            t.http.post("/v1/streams/m/-/events", json=[{"type": "count.x"}] * 3).raise_for_status()
            copy = {"name": "archive", "receiver": {"kind": "copy", "target": "/m-archive"}, "start": "beginning"}
            assert t.http.post("/v1/streams/m/-/subscriptions", json=copy).status_code == 201

            def scraped() -> str:
                try:
                    return httpx.get(scrape_url, timeout=5).text
                except httpx.TransportError:  # the worker still starting
                    return ""

            ok = f'yoke_actor_processed_total{{actor="counter",outcome="ok",tenant="{t.name}"}}'
            delivered = f'yoke_subscription_delivered_total{{name="archive",path="",tenant="{t.name}"}}'
            # The counter counts the copies too (count.* on any stream): 3 at least, each way; and the
            # database's gauges, present once a sampling pass of the worker's worked (metrics.md).
            text = wait_for(lambda: (s := scraped()) and (value(s, ok) or 0) >= 3 and (value(s, delivered) or 0) >= 3
                            and value(s, "yoke_metrics_sample_ok") == 1 and s,
                            "the worker's actor and subscription series and a sampling pass that worked")
            assert t.show(inst["id"])["state"]["value"]["n"] >= 3
            # The operations series of a worker.
            newest = read_migrations(f"yoke.store.{'sqlite' if kind == 'sqlite' else 'postgres'}")[-1].version
            assert re.search(r'^yoke_build_info\{commit="[^"]+",version="[^"]+"\} 1\.0$', text, re.M)
            assert value(text, "yoke_schema_version") == newest
            assert (value(text, "yoke_worker_heartbeats_total") or 0) > 0
            assert time.time() - (value(text, "yoke_worker_last_heartbeat_timestamp_seconds") or 0) < 10
            assert value(text, 'yoke_database_errors_total{kind="connection_lost"}') == 0
            assert value(text, "yoke_metrics_sample_ok") == 1
            assert (value(text, "yoke_workers_live") or 0) >= 1
            if kind == "postgres":
                assert (value(text, 'yoke_db_pool_connections{state="max"}') or 0) >= 1
                assert value(text, 'yoke_db_pool_connections{state="in_use"}') is not None
            # The API server runs no actors and delivers nothing: none of those series.
            served = httpx.get(server.url + "/metrics").text
            assert "yoke_actor_processed_total{" not in served and "yoke_subscription_delivered_total{" not in served
            assert "yoke_build_info{" in served
            # The worker's port serves its metrics and health, nothing else.
            base = f"http://127.0.0.1:{port}"
            assert httpx.get(base + "/healthz").json() == {"status": "ok"}
            assert httpx.get(base + "/v1/streams").status_code == 404
            assert httpx.post(base + "/metrics").status_code == 405
            # Removed, its series go with it.
            removed = t.http.delete("/v1/streams/m/-/subscription", params={"name": "archive"})
            assert removed.status_code == 204
            wait_for(lambda: "yoke_subscription_delivered_total{" not in scraped(), "the subscription's series to go")
            assert f'tenant="{t.name}"' in scraped()  # the actor's are still there
            t.http.close()
        finally:
            code = stop_worker(worker)
            stop_server(server)
        assert code == 0
        log = (tmp_path / f"worker-{port}.log").read_text()
        assert f"metrics at http://127.0.0.1:{port}/metrics" in log


def test_a_busy_metrics_port_fails_the_worker_at_once(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    port = server.url.rsplit(":", 1)[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "yoke.cli", "worker", "--app", APP, "--metrics-port", port],
            env={**os.environ, **FAST, "YOKE_DATABASE_URL": server.db_url}, capture_output=True, text=True,
            timeout=60, cwd=tmp_path,
        )
    finally:
        stop_server(server)
    assert done.returncode == 1
    assert done.stderr == f"error: 127.0.0.1:{port} is already in use; choose another port: `yoke worker --metrics-port N`\n"


def set_connections(db_url: str, allowed: bool) -> None:
    """Let no one (or everyone again) connect to the database, and end its sessions."""
    from tests.conftest import PG_ADMIN_URL

    name = urlsplit(db_url).path.lstrip("/")

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            if not allowed:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                    name,
                )
        finally:
            await conn.close()

    asyncio.run(run())


def test_metrics_answer_from_memory_while_the_database_is_away(tmp_path: Path) -> None:
    with own_database("postgres", tmp_path, "yoke_metrics_down") as db_url:
        server = start_server(db_url, tmp_path / ".yoke", args=("--app", APP), **FAST)
        try:
            t = Tenant(server)
            t.create("flaky", key="down")
            t.http.post("/v1/streams/d/-/events", json=[{"type": "flaky.fail", "payload": 1}]).raise_for_status()
            dead = f'yoke_actor_queue_rows{{status="dead",tenant="{t.name}"}}'
            wait_for(lambda: value(t.http.get("/metrics").text, dead) == 1, "the dead letter to be sampled")
            t.http.close()
            set_connections(db_url, False)
            try:
                started = time.monotonic()
                answer = httpx.get(server.url + "/metrics", timeout=10)
                assert answer.status_code == 200 and time.monotonic() - started < 2  # it was 503 after 3 s of retries
                text = wait_for(lambda: (s := httpx.get(server.url + "/metrics").text)
                                and value(s, "yoke_metrics_sample_ok") == 0 and s, "a failed sampling pass")
                assert value(text, dead) == 1  # the last value stays
                assert value(text, "yoke_metrics_sample_age_seconds") > 0
                errors = sum(value(text, f'yoke_database_errors_total{{kind="{k}"}}') or 0
                             for k in ("connection_lost", "connect_failed"))
                assert errors > 0
                assert httpx.get(server.url + "/readyz").status_code == 503
            finally:
                set_connections(db_url, True)
            wait_for(lambda: value(httpx.get(server.url + "/metrics").text, "yoke_metrics_sample_ok") == 1,
                     "sampling to work again")
        finally:
            stop_server(server)
