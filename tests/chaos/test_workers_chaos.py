"""Chaos: worker processes killed with SIGKILL while they process events.

PostgreSQL only. Three ``tests/chaos/worker.py`` processes share one fresh
database and run a concurrency-1 actor with 20 instances, each routed its
share of 5,000 events by a ``where`` on the payload. While the events are
appended (paced over ~30 s) and processed, a random worker is killed with
SIGKILL and restarted every 2-4 s. Then all three run undisturbed (each
registered and heartbeating) until the work is done.

Each ``process()`` records its run in ``chaos_runs`` with database-server
timestamps (see worker.py). At the end:

- every event was processed to completion at least once, by the instance
  its payload routes it to;
- no ``actor_queue`` row is left (pending, processing or dead), read as the
  superuser so row-level security hides nothing;
- no two completed runs of one instance overlap in time (concurrency=1
  holds across worker deaths, lease expiries and instance adoption).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import yoke
from tests.conftest import PG_ADMIN_URL, admin_sql
from yoke.store.postgres.store import with_user

from .worker import ACTOR, EVENT_TYPE

pytestmark = pytest.mark.chaos

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
TENANT = "chaos"
WORKERS = 3
INSTANCES = 20
EVENTS = 5000
# Small batches, paced: each fan-out pass stays short (routing evaluates
# every instance's `where` on every event) and kills land while work keeps
# arriving.
BATCHES = 50
APPEND_SPAN_S = 30.0
KILL_EVERY_S = (2.0, 4.0)
MIN_KILLS = 5
CHAOS_MAX_S = 45.0  # stop killing after this long even if work remains
START_DEADLINE_S = 30.0  # a (re)started worker registers within this
TAIL_DEADLINE_S = 90.0  # undisturbed workers finish within this
STOP_TIMEOUT_S = 15.0

RUNS_TABLE = """
CREATE TABLE chaos_runs (
    run_id       text        PRIMARY KEY,
    event_id     text        NOT NULL,
    instance_key text        NOT NULL,
    n            int         NOT NULL,
    attempt      int         NOT NULL,
    pid          int         NOT NULL,
    started      timestamptz NOT NULL,
    ended        timestamptz
);
GRANT SELECT, INSERT, UPDATE ON chaos_runs TO yoke_runtime;
"""


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + database))


class Workers:
    """The worker subprocesses: start, SIGKILL, restart, stop, logs."""

    def __init__(self, url: str, record_dsn: str, folder: Path) -> None:
        self._args = [sys.executable, str(WORKER_SCRIPT), url, record_dsn]
        self._folder = folder
        self._started = 0
        self.slots: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.kills = 0

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._started += 1
        log = self._folder / f"worker-{self._started}.log"
        data_dir = self._folder / f"data-{self._started}"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*self._args, str(data_dir)], stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self._folder,
            )
        self.logs.append(log)
        return proc

    def start(self, count: int) -> None:
        for _ in range(count):
            self.slots.append(self._spawn())

    def kill_and_restart(self, slot: int) -> None:
        proc = self.slots[slot]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        self.kills += 1
        self.slots[slot] = self._spawn()

    def check_alive(self) -> None:
        """A worker must only ever die by our hand."""
        for proc in self.slots:
            code = proc.poll()
            assert code is None, f"worker {proc.pid} exited on its own with {code}\n{self.log_tails()}"

    async def stop(self) -> list[int | None]:
        """SIGTERM (a clean shutdown), then SIGKILL whatever is left; exit codes."""
        for proc in self.slots:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.slots):
            await asyncio.sleep(0.05)
        codes = [p.poll() for p in self.slots]
        for proc in self.slots:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return codes

    def grep(self, needle: str) -> int:
        return sum(log.read_text(errors="replace").count(needle) for log in self.logs if log.exists())

    def log_tails(self, chars: int = 3000) -> str:
        parts = []
        for log in self.logs[-(WORKERS + 3) :]:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} ---\n{text[-chars:]}")
        return "\n".join(parts)


async def test_workers_killed_while_processing(tmp_path: Path) -> None:
    started = time.monotonic()
    name = f"yoke_chaos_{uuid.uuid4().hex[:12]}"
    await admin_sql(f'CREATE DATABASE "{name}"')
    url = with_database(PG_ADMIN_URL, name)
    workers = Workers(url, with_user(url, "yoke_runtime"), tmp_path)
    admin: asyncpg.Connection | None = None
    try:
        # This process migrates, creates the instances and appends; it runs no actors.
        async with yoke.open(url, data_dir=str(tmp_path / "driver")) as y:
            admin = await asyncpg.connect(url)  # superuser: sees every tenant's rows
            await admin.execute(RUNS_TABLE)
            for i in range(INSTANCES):
                await y.instances(TENANT).create(
                    ACTOR, key=f"i{i}", config={"n": i},
                    filter={"types": [EVENT_TYPE], "where": f"payload.n = {i}"},
                )

            async def registered() -> set[int]:
                rows = await admin.fetch("SELECT (info->>'pid')::int FROM runtime_workers")
                return {r[0] for r in rows}

            async def all_registered(what: str) -> None:
                """Poll until every current worker process has registered."""
                deadline = time.monotonic() + START_DEADLINE_S
                while {p.pid for p in workers.slots} - await registered():
                    workers.check_alive()
                    if time.monotonic() >= deadline:
                        pytest.fail(f"{what}: workers not registered after {START_DEADLINE_S}s:"
                                    f" {[p.pid for p in workers.slots]} vs {await registered()}"
                                    f"\n{workers.log_tails()}")
                    await asyncio.sleep(0.1)

            async def processed() -> int:
                return await admin.fetchval(
                    "SELECT count(DISTINCT event_id) FROM chaos_runs WHERE ended IS NOT NULL"
                )

            workers.start(WORKERS)
            await all_registered("start")

            events = [{"type": EVENT_TYPE, "payload": {"n": k % INSTANCES, "k": k}} for k in range(EVENTS)]
            size = EVENTS // BATCHES
            stream = y.stream("/chaos", TENANT)
            event_ids: set[str] = set()

            async def append_all() -> None:
                for b in range(BATCHES):
                    results = await stream.append_many(events[b * size : (b + 1) * size])
                    event_ids.update(r.id for r in results)
                    await asyncio.sleep(APPEND_SPAN_S / BATCHES)  # pacing, not synchronisation

            appender = asyncio.create_task(append_all())
            chaos_until = time.monotonic() + CHAOS_MAX_S
            progress: list[int] = []
            try:
                while True:
                    await asyncio.sleep(random.uniform(*KILL_EVERY_S))  # the chaos cadence
                    workers.check_alive()
                    progress.append(await processed())
                    over = time.monotonic() >= chaos_until
                    if appender.done() and workers.kills >= MIN_KILLS and (
                        progress[-1] >= EVENTS * 0.9 or over
                    ):
                        break
                    if over and time.monotonic() >= chaos_until + 10:
                        break
                    workers.kill_and_restart(random.randrange(WORKERS))
            finally:
                if not appender.done():
                    appender.cancel()
            await appender
            chaos_s = time.monotonic() - started
            assert workers.kills >= MIN_KILLS, f"only {workers.kills} kills"
            # The kills landed while work was in progress.
            assert progress[MIN_KILLS - 1] < EVENTS, progress

            # The tail: every worker registered, then undisturbed until all is done.
            await all_registered("tail")
            deadline = time.monotonic() + TAIL_DEADLINE_S
            while True:
                workers.check_alive()
                done = await processed()
                left = await admin.fetchval("SELECT count(*) FROM actor_queue")
                if done == EVENTS and left == 0:
                    break
                if time.monotonic() >= deadline:
                    statuses = await admin.fetch(
                        "SELECT status, count(*), max(attempts) FROM actor_queue GROUP BY 1"
                    )
                    owners = await admin.fetch(
                        "SELECT worker_id, count(*) FROM actor_instances GROUP BY 1"
                    )
                    pytest.fail(
                        f"not done {TAIL_DEADLINE_S}s after the chaos: {done}/{EVENTS} events"
                        f" processed, queue {[tuple(r) for r in statuses]}, owners"
                        f" {[tuple(r) for r in owners]}, registered {await registered()}"
                        f"\n{workers.log_tails()}"
                    )
                await asyncio.sleep(0.1)
            tail_s = time.monotonic() - started - chaos_s

        # Every appended event ran to completion, on the instance it routes to.
        assert len(event_ids) == EVENTS
        runs = await admin.fetch(
            "SELECT run_id, event_id, instance_key, n, attempt, pid, started, ended FROM chaos_runs"
        )
        completed = [r for r in runs if r["ended"] is not None]
        assert {r["event_id"] for r in completed} == event_ids
        wrong = [tuple(r) for r in runs if r["instance_key"] != f"i{r['n']}"]
        assert not wrong, f"events run by the wrong instance: {wrong[:5]}"
        assert await admin.fetchval("SELECT count(*) FROM actor_queue") == 0

        # Concurrency 1: an instance's completed runs never overlap.
        by_instance: dict[str, list[asyncpg.Record]] = defaultdict(list)
        for r in completed:
            by_instance[r["instance_key"]].append(r)
        overlaps = []
        for key, rows in by_instance.items():
            rows.sort(key=lambda r: r["started"])
            for a, b in zip(rows, rows[1:], strict=False):
                if b["started"] < a["ended"]:
                    overlaps.append((key, dict(a), dict(b)))
        assert not overlaps, f"{len(overlaps)} overlapping runs, e.g. {overlaps[:3]}"

        codes = await workers.stop()
        assert codes == [0] * WORKERS, f"unclean worker shutdown: {codes}\n{workers.log_tails()}"
        print(
            f"\nchaos: {workers.kills} kills; {len(completed)} completed runs for {EVENTS} events"
            f" ({len(completed) - EVENTS} repeats), {len(runs) - len(completed)} runs cut short,"
            f" {len({r['pid'] for r in completed})} worker processes ran events;"
            f" reaped while alive: {workers.grep('was reaped')}, errors logged:"
            f" {workers.grep(' ERROR ')}; chaos {chaos_s:.1f}s (progress at each kill {progress}),"
            f" tail {tail_s:.1f}s, total {time.monotonic() - started:.1f}s"
        )
    finally:
        await workers.stop()
        if admin is not None:
            await admin.close()
        await admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
