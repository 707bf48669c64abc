"""File storage on PostgreSQL: the instance that moves when its worker is
killed (SIGKILL) keeps its state, or the worker it would move to refuses to
start (actors/state_home.py). Real `yoke worker` processes, YOKE_STORAGE=file.

- Two workers with their own data directories: the second refuses at start,
  naming both directories; the first runs the ``stats`` instance (10
  ticks), is killed, and the second still refuses; a worker on the first
  directory takes over and counts on: 20 of 20, in ctx.state and ctx.sqlite.
  The API's SQL query answers from the first directory, and answers
  state_elsewhere (500) from the second rather than an empty database.
- Two workers sharing one data directory: the owner of ``stats`` is killed
  after 10 ticks, the other adopts it and counts on from the same files: 20
  of 20.

Before, the second worker started, adopted ``stats`` and counted from an
empty database: 10 of 10 (issue 40).
"""

from __future__ import annotations

import signal
from pathlib import Path

import asyncpg
import httpx
import pytest

import yoke
from yoke.actors.state_home import ID_FILE

from .fleet import Fleet, pg_database, until

pytestmark = pytest.mark.chaos

APP = "tests.chaos.stats_app:app"
T = "default"
SETTINGS = {"YOKE_STORAGE": "file", "YOKE_WORKER_HEARTBEAT_S": "0.3", "YOKE_WORKER_STALE_S": "2"}


async def tick(url: str, count: int) -> None:
    async with yoke.open(url, executor=False) as y:
        await y.stream("/ticks", T).append_many([{"type": "tick"}] * count)


async def counts(url: str, data_dir: Path) -> tuple[int, int]:
    """(ctx.state's ticks, rows of the ticks table) of the stats instance,
    read from ``data_dir`` by a process without an executor."""
    async with yoke.open(url, executor=False, data_dir=str(data_dir), storage="file") as y:
        found = await y.instances(T).list(actor="stats")
        if not found:
            return 0, 0
        state, _ = await y.instances(T).state(found[0].instance_id)
        try:
            rows = (await y.instances(T).query(found[0].instance_id, "SELECT count(*) FROM ticks")).rows[0][0]
        except yoke.errors.InvalidInput:  # no table yet
            rows = 0
        return (state or {}).get("ticks", 0), rows


async def drained(url: str) -> bool:
    """No queue row left: every run finished and its completion committed
    (a kill before that runs the last event again, as at-least-once allows)."""
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT count(*) FROM actor_queue") == 0
    finally:
        await conn.close()


async def owner(url: str) -> str | None:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT worker_id FROM actor_instances WHERE actor = 'stats'")
    finally:
        await conn.close()


async def test_killed_worker_with_its_own_directory(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    async with pg_database("yoke_home") as url:
        fleet = Fleet(url, tmp_path, **SETTINGS)
        try:
            a = fleet.worker("a", APP, YOKE_DATA_DIR=str(one))
            refused = fleet.start("b", "worker", "--app", APP, announce=False, YOKE_DATA_DIR=str(two))
            assert refused.popen.wait(60) == 1, refused.text()
            said = refused.text()
            assert "refusing to run actors" in said and str(one / "actors") in said and str(two / "actors") in said
            assert "YOKE_DATA_DIR" in said and "YOKE_STORAGE=pg_sqlite" in said

            await tick(url, 10)
            await until("10 ticks counted", lambda: _counted(url, one, 10), 60, fleet)
            await until("the queue drained", lambda: drained(url), 30, fleet)
            a.signal(signal.SIGKILL)
            a.popen.wait(10)
            again = fleet.start("b2", "worker", "--app", APP, announce=False, YOKE_DATA_DIR=str(two))
            assert again.popen.wait(60) == 1 and "refusing to run actors" in again.text(), again.text()
            assert not (two / "actors" / "default").exists()  # nothing ran there

            fleet.worker("a2", APP, YOKE_DATA_DIR=str(one))
            await tick(url, 10)
            await until("20 of 20", lambda: _counted(url, one, 20), 60, fleet)

            # The API's SQL query: answered from the recorded directory, refused elsewhere.
            query = {"sql": "SELECT count(*) FROM ticks"}
            for name, data_dir in (("api-one", one), ("api-two", two)):
                api = fleet.start(name, "serve", "--no-executor", "--port", "0", "--dev", YOKE_DATA_DIR=str(data_dir))
                async with httpx.AsyncClient(base_url=api.announced["url"]) as client:
                    (stats,) = (await client.get("/v1/instances", params={"actor": "stats"})).json()["instances"]
                    answer = await client.post(f"/v1/instances/{stats['id']}/sql", json=query)
                if data_dir == one:
                    assert answer.status_code == 200 and answer.json()["rows"] == [[20]], answer.text
                else:
                    assert answer.status_code == 500, answer.text
                    assert answer.json()["error"]["code"] == "state_elsewhere"
                    assert str(one / "actors") in answer.json()["error"]["message"]
        finally:
            fleet.stop()


async def test_killed_worker_sharing_the_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    async with pg_database("yoke_home") as url:
        fleet = Fleet(url, tmp_path, **SETTINGS)
        try:
            workers = {}
            for name in ("a", "b"):
                w = fleet.worker(name, APP, YOKE_DATA_DIR=str(shared))
                workers[w.announced["worker_id"]] = w
            await tick(url, 10)
            await until("10 ticks counted", lambda: _counted(url, shared, 10), 60, fleet)
            await until("the queue drained", lambda: drained(url), 30, fleet)
            first = await owner(url)
            workers[first].signal(signal.SIGKILL)
            workers[first].popen.wait(10)
            await tick(url, 10)
            await until("20 of 20", lambda: _counted(url, shared, 20), 60, fleet)
            assert await owner(url) not in (first, None)  # the other one adopted it
            assert (shared / "actors" / ID_FILE).exists()
        finally:
            fleet.stop()


async def _counted(url: str, data_dir: Path, expected: int) -> bool:
    found = await counts(url, data_dir)
    assert found[0] <= expected and found[1] <= expected, found  # never more: nothing counted twice
    return found == (expected, expected)
