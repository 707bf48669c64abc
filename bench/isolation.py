#!/usr/bin/env python
"""What a busy handler costs everyone else: heartbeats, fan-out and other
instances' runs while one process() spins on the CPU for ``--busy-s`` (10)
seconds, with actors in-process and in host processes (docs/advanced/hosts.md).

One runtime per mode (``isolation=inprocess`` / ``process``), the actors of
bench/hosts_app.py: ``busy`` spins, ``probe`` does nothing. A ticker task in
the runtime's event loop appends a probe event every ``--tick-ms`` (100)
from before the busy run starts until after it ends. Reported per mode:

- heartbeat gap: the longest time between two worker heartbeats written to
  the store (the period is 1 s; in-process the busy run blocks them);
- loop lag: how late the ticker's sleeps wake, at worst;
- fan-out delay: the worst time from a probe event's append call to its
  process() returning (fan-out, claim, run), as the kernel's run hook sees it;
- probe runs during the busy run: other instances' runs finished while
  ``busy`` was running.

    python bench/isolation.py [--backend sqlite|postgres] [--busy-s 10] [--tick-ms 100]

PostgreSQL runs in a scratch database via ``YOKE_BENCH_PG_URL`` (see
bench/append.py); SQLite in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import yoke
from append import scratch  # bench/append.py (scripts run from bench/)
from hosts_app import app  # bench/hosts_app.py

TENANT = "bench"


async def measure(backend: str, mode: str, busy_s: float, tick_s: float) -> dict[str, Any]:
    beats: list[float] = []
    finished_probe: dict[int, float] = {}
    busy_window: list[float] = []

    def on_run(row: Any, started: float, finished: float, ok: bool) -> None:
        if row.actor == "busy":
            busy_window[:] = [started, finished]
        elif row.actor == "probe":
            finished_probe[row.event["payload"]["n"]] = finished

    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=app, isolation=mode, host_processes=2, data_dir=str(folder)) as y:
            assert y.executor is not None
            y.executor.scheduler.on_run = on_run
            store_actors = y.store.actors
            original = store_actors.heartbeat

            async def heartbeat(*args: Any, **kwargs: Any) -> Any:
                beats.append(time.time())
                return await original(*args, **kwargs)

            store_actors.heartbeat = heartbeat
            instances = y.instances(TENANT)
            await instances.create("busy", key="b", filter={"types": ["busy"]})
            await instances.create("probe", key="p", filter={"types": ["probe"]})
            stream = y.stream("/", TENANT)
            await stream.append({"type": "probe", "payload": {"n": -1}})
            await y.wait_idle(timeout_s=60)
            while len(beats) < 2:  # a heartbeat before the busy run, to measure the gap from
                await asyncio.sleep(0.05)
            appended: dict[int, float] = {}
            lags: list[float] = []
            end_at = time.time() + busy_s + 3
            n = 0
            await stream.append({"type": "busy", "payload": {"seconds": busy_s}})
            while time.time() < end_at or not busy_window:
                appended[n] = time.time()
                await stream.append({"type": "probe", "payload": {"n": n}})
                n += 1
                asked = time.monotonic()
                await asyncio.sleep(tick_s)
                lags.append(time.monotonic() - asked - tick_s)
            await y.wait_idle(timeout_s=120)
        start, finish = busy_window
        delays = [finished_probe[k] - appended[k] for k in appended if k in finished_probe]
        during = sum(1 for t in finished_probe.values() if start < t < finish)
        window_beats = [b for b in beats if start - 2 < b < finish + 2]
        gaps = [b - a for a, b in zip(window_beats, window_beats[1:])]
        return {
            "backend": backend, "isolation": mode, "busy_s": round(finish - start, 2),
            "heartbeat_gap_max_s": round(max(gaps), 2) if gaps else None,
            "loop_lag_max_ms": round(max(lags) * 1000, 1),
            "fanout_delay_max_ms": round(max(delays) * 1000, 1),
            "fanout_delay_median_ms": round(sorted(delays)[len(delays) // 2] * 1000, 1),
            "probe_runs_during_busy": during, "probe_events": len(appended),
        }


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--busy-s", type=float, default=10.0)
    parser.add_argument("--tick-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    rows = []
    for mode in ("inprocess", "process"):
        row = await measure(args.backend, mode, args.busy_s, args.tick_ms / 1000)
        print(f"{args.backend} {mode}: busy run {row['busy_s']} s; heartbeat gap max"
              f" {row['heartbeat_gap_max_s']} s; loop lag max {row['loop_lag_max_ms']} ms; fan-out delay"
              f" max {row['fanout_delay_max_ms']} ms (median {row['fanout_delay_median_ms']} ms);"
              f" probe runs during it {row['probe_runs_during_busy']} of {row['probe_events']}", flush=True)
        rows.append(row)
    print(json.dumps(rows), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
