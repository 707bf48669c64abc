"""A run's end reaches every claim loop, not only the one that claimed it.

The scheduler claims in two shards (claim_shards), and both count the runs
of either. A loop whose claim pass ended while another loop's run was
still going (an actor awaiting ctx.sqlite, say) stayed not idle, and one
that found no free slot (max_in_flight) left its tenant for later; neither
heard of the run's end before the periodic sweep. With the sweep at 30 s,
anything near it is that bug: wait_idle must return, and every row run,
within a few seconds.
"""

from __future__ import annotations

import asyncio
import time

import yoke
from yoke import App, Filter

T = "acme"
SWEEP_S = 30.0
WITHIN_S = 5.0


async def test_wait_idle_returns_at_once_after_a_run_using_ctx_sqlite(fresh_url: str, tmp_path) -> None:
    app = App()
    running = asyncio.Event()
    release = asyncio.Event()
    seen: list[int] = []
    instance: list[str] = []

    @app.actor("writer", filter=Filter(types=["x"]), singleton=True)
    async def writer(ctx, event):
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
        await ctx.sqlite.exec("INSERT INTO t VALUES (?)", [event.payload["n"]])
        instance[:] = [ctx.instance.instance_id]
        running.set()
        await release.wait()
        seen.append(event.payload["n"])

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), scheduler_sweep_s=SWEEP_S) as y:
        for n in range(3):
            running.clear()
            release.clear()
            await y.stream("/s", T).append({"type": "x", "payload": {"n": n}})
            await asyncio.wait_for(running.wait(), WITHIN_S)
            # Every claim loop makes a pass while the run goes on (the race
            # a slow ctx.sqlite call loses, made certain): a redrive of
            # nothing wakes them all.
            await y.instances(T).redrive(instance[0])
            await asyncio.sleep(0.3)
            release.set()
            started = time.monotonic()
            await y.wait_idle(timeout_s=WITHIN_S)
            assert time.monotonic() - started < WITHIN_S
        assert seen == [0, 1, 2]
        rows = await y.instances(T).query(instance[0], "SELECT n FROM t ORDER BY n")
        assert rows.rows == [[0], [1], [2]]


async def test_a_run_ending_frees_its_slot_for_every_shard(fresh_url: str, tmp_path) -> None:
    """max_in_flight 1: a loop that found no free slot claims once another
    loop's run ends, not at the sweep."""
    app = App()
    done: set[str] = set()

    @app.actor("keyed", filter=Filter(types=["job"], key="payload.k"))
    async def keyed(ctx, event):
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS t (k TEXT)")
        await asyncio.sleep(0.02)
        done.add(event.payload["k"])

    keys = [f"k{i}" for i in range(12)]  # both shards get some (all in one: 1 in 2,000)
    async with yoke.open(
        fresh_url, app=app, data_dir=str(tmp_path), scheduler_sweep_s=SWEEP_S, max_in_flight=1
    ) as y:
        started = time.monotonic()
        await y.stream("/s", T).append_many([{"type": "job", "payload": {"k": k}} for k in keys])
        await y.wait_idle(timeout_s=WITHIN_S)
        assert time.monotonic() - started < WITHIN_S
        assert done == set(keys)
