"""A worker for tests/faults/test_atomic_kill9.py: runs the atomic
``counter`` actor until no queue row is left (exit 0), or until
``YOKE_TEST_CRASH_AT=<point>:<n>`` kills it with SIGKILL at a step of the
commit (yoke/actors/crash_points.py).

    python tests/faults/atomic_worker.py <yoke_url> <data_dir> <settings json>
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import yoke
from yoke import App, Filter
from yoke.actors import crash_points

EVENTS_STREAM = "/out"
WORKER_SETTINGS = {"worker_heartbeat_s": 0.3, "worker_stale_s": 2.0, "scheduler_sweep_s": 0.3}

app = App()


@app.actor("child")
async def child(ctx, event) -> None:  # noqa: ANN001
    pass


@app.actor("counter", filter=Filter(types=["inc"]), effects="atomic", timeout_s=2.0, max_attempts=100,
           retry_base_s=0.05, retry_max_s=0.2)
async def counter(ctx, event) -> None:  # noqa: ANN001
    n = event.payload["n"]
    await ctx.state.update(lambda s: {**s, "count": s.get("count", 0) + 1})
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (n INTEGER)")
    await ctx.sqlite.exec("INSERT INTO seen VALUES (?)", [n])
    crash_points.reached("in_run")  # killed here: the writes above were never committed
    await ctx.append({"type": "counted", "payload": {"n": n}}, EVENTS_STREAM)
    await ctx.schedules.upsert(f"s{n}", event={"type": "later"}, after_s=3600)
    await ctx.instances.create("child", config={"n": n})  # a new key each call: a repeat would show
    await ctx.conversations.post_message(f"c{n}", "bot", {"n": n})


async def main(url: str, data_dir: str, settings: dict) -> None:
    async with yoke.open(url, app=app, data_dir=data_dir, **WORKER_SETTINGS, **settings) as y:
        deadline = time.monotonic() + 120
        while await y.store.actors.unfinished(["counter"]) > 0:
            if time.monotonic() > deadline:
                sys.exit(3)
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
