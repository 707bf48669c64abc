#!/usr/bin/env python
"""How long a fork of an instance with a long history takes
(docs/advanced/forks.md; the target: 10,000 inputs under 10 s).

One keyed actor whose process() does what a typical handler does: a
``ctx.state.update``, an upsert into its own table and one append. An
instance gets ``--inputs`` (10,000) events; then, timed: a fork replaying
them all (reading the kept inputs, the runs in the sandbox, the fork
kept), its diff against the live instance, and the deploy check of that
instance (two replays, nothing kept). Each backend in a fresh database.
Also: what keeping inputs costs the live runs, as the events/s of the
same history with the inputs kept (the default) — compare with the
figures of bench/idle_latency.py's burst.

    python bench/forks.py [--backend all|sqlite|postgres] [--inputs N] [--runs N]

PostgreSQL: a scratch database on YOKE_BENCH_PG_URL (bench/append.py).
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import yoke
from append import scratch  # bench/append.py (scripts run from bench/)
from yoke import App, Filter

T = "bench"
BATCH = 1000


def bench_app() -> App:
    app = App()

    @app.actor("account", filter=Filter(types=["account.*"], key="payload.id"))
    async def account(ctx, event):
        amount = event.payload["amount"]
        await ctx.state.update(lambda s: {"balance": s.get("balance", 0) + amount, "n": s.get("n", 0) + 1},
                               default={})
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS moves (k INTEGER PRIMARY KEY, amount INTEGER)")
        await ctx.sqlite.exec("INSERT OR REPLACE INTO moves VALUES (?, ?)", [event.payload["k"] % 500, amount])
        await ctx.append({"type": "account.moved", "payload": {"amount": amount}}, stream="/moves")

    return app


async def one(backend: str, inputs: int, runs: int) -> dict[str, Any]:
    app = bench_app()
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=app, data_dir=str(folder)) as y:
            started = time.perf_counter()
            for first in range(0, inputs, BATCH):
                await y.stream("/accounts", T).append_many(
                    [{"type": "account.move", "payload": {"id": "A", "k": k, "amount": k % 7}}
                     for k in range(first, min(first + BATCH, inputs))]
                )
            await y.wait_idle(timeout_s=3600)
            live_s = time.perf_counter() - started
            inst = await y.instances(T).find("account", "A")
            fork_s, diff_s, check_s = [], [], []
            for _ in range(runs):
                t0 = time.perf_counter()
                fork = await y.instances(T).fork(inst.instance_id)
                fork_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                d = await fork.diff()
                diff_s.append(time.perf_counter() - t0)
                assert not d["changed"], d
                t0 = time.perf_counter()
                report = await y.check_deploy(app, tenants=[T])
                check_s.append(time.perf_counter() - t0)
                assert report["checked"] == 1 and report["diverged"] == 0, report
                await fork.discard()
            assert fork.row.summary["runs"] == inputs
    return {
        "backend": backend, "inputs": inputs, "live_events_per_s": round(inputs / live_s),
        "fork_s": round(statistics.median(fork_s), 2), "fork_s_range": [round(min(fork_s), 2), round(max(fork_s), 2)],
        "diff_s": round(statistics.median(diff_s), 2), "check_deploy_s": round(statistics.median(check_s), 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="all", choices=["all", "sqlite", "postgres"])
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    figures = []
    for backend in backends:
        result = await one(backend, args.inputs, args.runs)
        print(f"{backend}: {args.inputs} inputs: live {result['live_events_per_s']} events/s;"
              f" fork {result['fork_s']} s (range {result['fork_s_range']}), diff {result['diff_s']} s,"
              f" deploy check {result['check_deploy_s']} s", flush=True)
        figures.append(result)
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
