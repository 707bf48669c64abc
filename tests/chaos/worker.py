"""A worker process for the chaos test: runs the ``chaos`` actor until killed.

    python tests/chaos/worker.py <yoke_url> <record_dsn> <data_dir>

``process()`` records each run in ``chaos_runs`` (a plain table in the same
PostgreSQL database, outside Yoke): its first statement inserts the run
(event id, instance key, the event's routing number, attempt, pid) with
``started = clock_timestamp()``, its last sets ``ended = clock_timestamp()``,
each committed before the next step. So every timestamp comes from one
clock (the database server's, whichever worker wrote it), a run killed
halfway is visible as started but never ended, and the recorded [started,
ended] interval lies inside the real run: two completed runs whose recorded
intervals overlap really did overlap.

SIGTERM closes the runtime cleanly; SIGKILL is the chaos.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import secrets
import signal
import sys

import asyncpg

import yoke
from yoke import App, Filter

ACTOR = "chaos"
EVENT_TYPE = "chaos.work"
# Short enough that a killed worker's leases (timeout + 1 s grace) expire
# quickly, long enough that a run (a few ms of sleep, two statements) does
# not time out on a loaded machine (if one does, it is retried: harmless).
TIMEOUT_S = 3.0
MAX_ATTEMPTS = 100  # a row may be caught by several kills; it must never go dead
WORKER_SETTINGS = {
    "worker_heartbeat_s": 0.3,
    "worker_stale_s": 2.0,
    "scheduler_sweep_s": 0.5,
    "pg_pool_max": 10,
}

STARTED = (
    "INSERT INTO chaos_runs (run_id, event_id, instance_key, n, attempt, pid, started)"
    " VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())"
)
ENDED = "UPDATE chaos_runs SET ended = clock_timestamp() WHERE run_id = $1"

app = App()
_pool: asyncpg.Pool | None = None
_runs = itertools.count(1)
_me = f"{os.getpid()}-{secrets.token_hex(4)}"


@app.actor(ACTOR, filter=Filter(types=[EVENT_TYPE]), concurrency=1, max_attempts=MAX_ATTEMPTS,
           timeout_s=TIMEOUT_S, retry_base_s=0.05, retry_max_s=0.5)
async def process(ctx, event) -> None:  # noqa: ANN001
    assert _pool is not None
    run_id = f"{_me}-{next(_runs)}"
    await _pool.execute(STARTED, run_id, event.id, ctx.instance.key, event.payload["n"],
                        ctx.attempt, os.getpid())
    await asyncio.sleep(random.uniform(0.002, 0.006))
    await _pool.execute(ENDED, run_id)


async def main(yoke_url: str, record_dsn: str, data_dir: str) -> None:
    global _pool
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    _pool = await asyncpg.create_pool(record_dsn, min_size=1, max_size=5)
    try:
        async with yoke.open(yoke_url, app=app, data_dir=data_dir, **WORKER_SETTINGS) as y:
            print(f"worker {os.getpid()} {y.worker_id} running", flush=True)
            await stop.wait()
    finally:
        await _pool.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [{os.getpid()}] %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(main(*sys.argv[1:4]))
