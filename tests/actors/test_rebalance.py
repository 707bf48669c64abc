"""Workers share the instances (PostgreSQL, real ``yoke worker`` processes):
the first worker up owns all 60; two more join and within 10 s each owns a
third; one leaves (SIGTERM) and one dies (kill -9), and the survivor owns
them all again. Under a steady load throughout, no instance ever runs in
two workers at once and every queued input is processed."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import yoke
from tests.conftest import empty_database

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.actors.rebalance_app:app"
T = "default"
KEYS = 60
SETTLE_S = 10.0  # the bound the workers must share the instances within


class Worker:
    def __init__(self, db_url: str, log: Path) -> None:
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("YOKE_")},
            "PYTHONPATH": str(ROOT), "YOKE_DATABASE_URL": db_url, "YOKE_WORKER_HEARTBEAT_S": "0.25",
            "YOKE_WORKER_STALE_S": "2", "YOKE_SCHEDULER_SWEEP_S": "0.2",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", "worker", "--app", APP, "--json"], env=environment,
            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, cwd=log.parent,
        )
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        assert ready, f"the worker printed nothing: {log.read_text()}"
        self.worker_id = json.loads(self.process.stdout.readline())["worker_id"]
        self.pid = self.process.pid

    def end(self, sig: int) -> None:
        self.process.send_signal(sig)
        self.process.wait(60)


async def read_all(stream) -> list:  # noqa: ANN001
    events: list = []
    while page := await stream.read(events[-1].offset if events else 0, limit=10_000):
        events += page
    return events


async def owners(y: yoke.Runtime) -> Counter[str | None]:
    return Counter(i.worker_id for i in await y.instances(T).list(limit=1000))


async def settled(y: yoke.Runtime, expected: dict[str, int]) -> float:
    """Seconds until the instances are owned exactly as ``expected``."""
    started = time.monotonic()
    seen: Counter[str | None] = Counter()
    while time.monotonic() - started < SETTLE_S + 20:
        seen = await owners(y)
        if seen == Counter(expected):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"owners {dict(seen)} never became {expected}")


@pytest.mark.parametrize("fresh_url", ["postgres"], indirect=True)
async def test_workers_share_the_instances_as_they_join_and_leave(fresh_url: str, tmp_path) -> None:
    await empty_database(fresh_url)
    sent = 0
    stop = asyncio.Event()

    async with yoke.open(fresh_url, executor=False) as y:
        jobs = y.stream("/jobs", T)

        async def load() -> None:  # a steady trickle to every key
            nonlocal sent
            while not stop.is_set():
                await jobs.append({"type": "job", "payload": {"k": str(sent % KEYS), "seq": sent}})
                sent += 1
                await asyncio.sleep(0.01)

        a = Worker(fresh_url, tmp_path / "a.log")
        workers = [a]
        try:
            loading = asyncio.create_task(load())
            await settled(y, {a.worker_id: KEYS})  # fan-out created them all on a
            b, c = Worker(fresh_url, tmp_path / "b.log"), Worker(fresh_url, tmp_path / "c.log")
            workers += [b, c]
            joined = await settled(y, {w.worker_id: KEYS // 3 for w in workers})
            assert joined < SETTLE_S, f"three workers took {joined:.1f}s to share the instances"
            runs = y.stream("/runs", T)
            c.end(signal.SIGTERM)  # leaves cleanly: its instances are unowned at once
            await runs.append({"type": "worker.exited", "payload": {"pid": c.pid}})
            left = await settled(y, {a.worker_id: KEYS // 2, b.worker_id: KEYS // 2})
            assert left < SETTLE_S
            b.end(signal.SIGKILL)  # dies: reaped after worker_stale_s
            await runs.append({"type": "worker.exited", "payload": {"pid": b.pid}})
            died = await settled(y, {a.worker_id: KEYS})
            assert died < SETTLE_S
            print(f"settled: joined {joined:.2f}s, left {left:.2f}s, died {died:.2f}s")
            stop.set()
            await loading
            # Every input processed: a run ended for each sequence number.
            deadline = time.monotonic() + 60
            while True:
                events = await read_all(runs)
                ended = {e.payload["seq"] for e in events if e.type == "run.end"}
                if len(ended) == sent or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert ended == set(range(sent)), f"{sent - len(ended)} of {sent} inputs never processed"
        finally:
            stop.set()
            for w in workers:
                if w.process.poll() is None:
                    w.end(signal.SIGTERM)

    # No instance ran in two workers at once: per instance, in commit order,
    # each start is followed by its own end, except a run cut short in a
    # worker that stopped or died (a start without an end): another start of
    # that instance may come only after the test saw that process exit.
    open_run: dict[str, dict] = {}
    exited: set[int] = set()
    for e in events:
        p = e.payload
        if e.type == "worker.exited":
            exited.add(p["pid"])
        elif e.type == "run.start":
            before = open_run.get(p["instance"])
            assert before is None or before["pid"] in exited, f"two runs of {p['instance']} at once: {before}, {p}"
            open_run[p["instance"]] = p
        elif open_run.get(p["instance"]) is not None and open_run[p["instance"]]["seq"] == p["seq"]:
            open_run[p["instance"]] = None
        else:
            assert p["pid"] in exited, f"an end without its start: {p}"
    moved = {e.payload["instance"] for e in events if e.type != "worker.exited" and e.payload["pid"] != a.pid}
    assert moved, "no instance ever ran outside the first worker"
