"""PostgreSQL connection cuts under actor load.

Jobs are appended (with keys) to a stream of the tenant while two actor
instances process them, each ``process()`` appending one result with a key
derived from the job: every session of the runtime role is terminated five
times, paced by the runs. Fan-out, claims, completions and the actors' own
appends all cross the cuts. In the end every job has exactly one result per
instance, nothing is dead-lettered, nothing is left in the queues, and the
only error that reached any caller (producers or ``process()``) is
``unavailable``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import yoke
from yoke import App, Filter, errors

from .common import Cutter, Progress, assert_exact, pg_database

TENANT = "faults"
JOBS = 400
CUTS = 5
INSTANCES = ("a", "b")


async def test_cuts_under_actor_load(tmp_path: Path) -> None:
    app = App()
    runs = Progress()
    seen_errors: Counter = Counter()

    @app.actor("worker", filter=Filter(types=["job"]), concurrency=4, max_attempts=100,
               timeout_s=2, retry_base_s=0.05, retry_max_s=0.2)
    async def worker(ctx, event):  # noqa: ANN001
        try:
            await ctx.append(
                {"type": "result", "payload": {"job": event.payload["n"]},
                 "idempotency_key": f"{ctx.instance.key}-{event.payload['n']}"},
                stream="/results",
            )
        except Exception as exc:
            seen_errors[type(exc)] += 1
            raise  # the run fails and is retried
        await runs.add()

    async with pg_database() as url, Cutter(url) as cutter:
        async with yoke.open(url, app=app, data_dir=str(tmp_path), worker_heartbeat_s=0.3) as y:
            for key in INSTANCES:
                await y.instances(TENANT).create("worker", key=key)
            jobs = y.stream("/jobs", tenant=TENANT)  # "/" also holds lifecycle facts
            produced: list[str] = []
            producer_errors: Counter = Counter()

            async def produce() -> None:
                for n in range(JOBS):
                    key = f"job-{n}"
                    while True:
                        try:
                            await jobs.append({"type": "job", "payload": {"n": n}, "idempotency_key": key})
                            break
                        except errors.Unavailable:
                            producer_errors[errors.Unavailable] += 1
                        except Exception as exc:  # noqa: BLE001 - asserted below
                            producer_errors[type(exc)] += 1
                            return
                    produced.append(key)

            producer = asyncio.create_task(produce())
            expected_runs = JOBS * len(INSTANCES)
            for i in range(1, CUTS + 1):
                await runs.reach(i * expected_runs // (CUTS + 2), timeout_s=20)
                await cutter.cut()
            await producer
            await y.wait_idle(timeout_s=20)

            assert set(producer_errors) <= {errors.Unavailable}, producer_errors
            assert set(seen_errors) <= {errors.Unavailable}, seen_errors
            assert_exact(await jobs.read(limit=10_000), produced)
            results = await y.stream("/results", tenant=TENANT).read(limit=10_000)
            assert_exact(results, [f"{k}-{n}" for k in INSTANCES for n in range(JOBS)])
            for key in INSTANCES:
                instance = await y.instances(TENANT).find("worker", key)
                assert instance is not None
                assert await y.instances(TENANT).dead(instance.instance_id) == []
                depth = await y.instances(TENANT).depth(instance.instance_id)
                assert (depth.pending, depth.processing, depth.dead) == (0, 0, 0), depth
            print(f"sessions ended {cutter.sessions_ended}; process() errors {dict(seen_errors)};"
                  f" producer errors {dict(producer_errors)}")
