"""Atomic mode under SIGKILL (docs/advanced/effects.md): a worker process is killed
at every step boundary of an atomic run's commit, in turn, and restarted;
in the end each event's effects exist exactly once: the state counter
equals the number of events, each event's row, appended event, child
instance and conversation message exists once. Both backends; file,
pg_sqlite and S3 storage.

The points (yoke/actors/crash_points.py): ``in_run`` (inside process(),
after state writes), ``before_commit`` (process() returned), ``before_upload``
(S3: committed locally, not uploaded), ``local_commit`` (the database
committed, with its applied marker unless pg_sqlite; S3: uploaded),
``replay`` (a later run found the marker, before its store transaction),
``store_commit`` (the store transaction committed). Each worker is killed
at the second time it reaches its point, so it also commits a run fully.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

import yoke
from tests.faults.atomic_worker import app
from tests.actors.test_state_s3 import aws_env, bucket, moto_endpoint, s3, s3_options  # noqa: F401

from .common import pg_database

T = "default"
EVENTS = 14
WORKER = str(Path(__file__).with_name("atomic_worker.py"))
ROOT = str(Path(__file__).parents[2])

CHAINS = {
    "file": ["in_run:2", "before_commit:2", "local_commit:2", "replay:1", "store_commit:2"],
    "pg_sqlite": ["in_run:2", "before_commit:2", "local_commit:2", "store_commit:2"],
    "s3": ["in_run:2", "before_commit:2", "before_upload:2", "local_commit:2", "replay:1", "store_commit:2"],
}


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/yoke.db"
        return
    async with pg_database("yoke_atomic") as url:
        yield url


async def run_worker(url: str, data_dir: Path, settings: dict, crash_at: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "YOKE_TEST_CRASH_AT"}
    env["PYTHONPATH"] = ROOT
    if crash_at is not None:
        env["YOKE_TEST_CRASH_AT"] = crash_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable, WORKER, url, str(data_dir), json.dumps(settings), env=env, cwd=ROOT,
    )
    try:
        async with asyncio.timeout(180):
            return await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise


async def kill_at_every_step(url: str, data_dir: Path, storage: str, settings: dict) -> None:
    async with yoke.open(url, app=app, executor=False, data_dir=str(data_dir), **settings) as y:
        await y.instances(T).create("counter", key="k")
        await y.stream("/", T).append_many([{"type": "inc", "payload": {"n": n}} for n in range(EVENTS)])
    for point in CHAINS[storage]:
        code = await run_worker(url, data_dir, settings, point)
        assert code == -signal.SIGKILL, f"the worker was to die at {point}, but exited with {code}"
    assert await run_worker(url, data_dir, settings, None) == 0

    async with yoke.open(url, app=app, executor=False, data_dir=str(data_dir), **settings) as y:
        inst = await y.instances(T).find("counter", "k")
        assert inst is not None
        assert (await y.instances(T).depth(inst.instance_id)).dead == 0
        state, _ = await y.instances(T).state(inst.instance_id)
        assert state == {"count": EVENTS}
        seen = await y.instances(T).query(inst.instance_id, "SELECT count(*), count(DISTINCT n) FROM seen")
        assert seen.rows == [[EVENTS, EVENTS]]
        out = await y.stream("/out", T).read(after=0, limit=1000)
        assert sorted(e.payload["n"] for e in out) == list(range(EVENTS))
        children = await y.instances(T).list(actor="child", limit=1000)
        assert sorted(c.config["n"] for c in children) == list(range(EVENTS))
        schedules = await y.instances(T).schedules(inst.instance_id)
        assert len(schedules) == EVENTS
        posted = [e for e in await y.stream("/", T).read(after=0, limit=10_000)
                  if e.type == "conversation.message.posted"]
        assert sorted(e.payload["conversation_id"] for e in posted) == sorted(f"c{n}" for n in range(EVENTS))
        for n in range(EVENTS):
            assert len(await y.store.actors.messages(T, f"c{n}", None, 10)) == 1


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_killed_at_every_step_of_the_commit(db_url: str, tmp_path: Path, storage: str) -> None:
    await kill_at_every_step(db_url, tmp_path / "data", storage, {"storage": storage})


async def test_killed_at_every_step_of_the_commit_on_s3(
    db_url: str, tmp_path: Path, moto_endpoint: str, bucket: str,  # noqa: F811
) -> None:
    settings = s3_options(moto_endpoint, bucket, "lazy", tmp_path / "data")
    data_dir = Path(settings.pop("data_dir"))
    await kill_at_every_step(db_url, data_dir, "s3", settings)
