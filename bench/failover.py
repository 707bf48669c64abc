#!/usr/bin/env python
"""Recovery times (RTO) and data loss (RPO) of Yoke through PostgreSQL
failovers under load, on a real Patroni cluster: a primary and a
synchronous standby (``--async``: an asynchronous one), Patroni's timings
as in tests/ha/cluster.py (``ttl`` 10 s, ``loop_wait`` 1 s,
``retry_timeout`` 4 s, ``master_start_timeout`` 0).

Each round is the scenario of tests/ha/test_failover.py
(tests/ha/scenario.py): `yoke serve` on the cluster's multi-host URL under
load (3 HTTP appenders with idempotency keys, a Durable Streams producer,
100 keyed actor instances, a copy and a webhook subscription, an SSE
tail); kill -9 the primary's postmaster, wait for the old primary to
return as the standby, ``patronictl switchover`` back, then freeze the
primary (SIGSTOP on all its processes: a hung machine, a partition) until
Patroni promotes past it. Per round, from
the moment of each fault: until Patroni reports the new primary; the
longest wait for an acknowledged append (clients retry every 0.1 s); the
longest time with no actor run committing; and the acknowledged appends
lost.

    python bench/failover.py [--rounds N] [--async]

Needs Debian's patroni and etcd-server (``make patroni``). The last line
printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's tests/ package

from tests.ha.cluster import installed, start_cluster  # noqa: E402
from tests.ha.scenario import run_failovers  # noqa: E402

MEASURES = ["promoted_s", "crash_appends_s", "crash_actors_s", "rejoined_s",
            "switched_s", "switch_appends_s", "switch_actors_s",
            "freeze_promoted_s", "freeze_appends_s", "freeze_actors_s", "schedule_gap_s"]


async def one_round(synchronous: bool) -> dict:
    cluster = start_cluster(synchronous=synchronous)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures, load, outcome, hooks = await run_failovers(cluster, Path(tmp) / ".yoke")
    finally:
        cluster.stop()
    out = {k: round(v, 2) for k, v in asdict(figures).items() if k in MEASURES}
    out.update(
        orders=len(outcome.orders), acknowledged=len(load.acks), lost=len(outcome.lost),
        actor_runs=outcome.runs, webhook_deliveries=hooks["deliveries"],
        client_retries=sum(load.failures.values()), tail_reconnects=load.tail_reconnects,
        failures=dict(load.failures), failed_over=figures.extra["failed_over"],
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--async", dest="asynchronous", action="store_true",
                        help="asynchronous streaming replication (synchronous_mode off)")
    args = parser.parse_args()
    if not installed():
        sys.exit("patroni and etcd-server are not installed: make patroni")
    rounds = []
    for i in range(args.rounds):
        try:
            result = asyncio.run(one_round(not args.asynchronous))
        except (TimeoutError, AssertionError) as exc:  # e.g. Patroni declined a switchover (--async)
            print(f"round {i + 1} failed: {str(exc).splitlines()[0][:300]}", flush=True)
            continue
        rounds.append(result)
        print(f"round {i + 1}: " + ", ".join(f"{k} {result[k]}" for k in MEASURES)
              + ("" if result["failed_over"] else " (the crashed primary was restarted, no failover)")
              + f"; {result['orders']} orders, {result['lost']} acknowledged appends lost, "
              f"{result['actor_runs'] - result['orders']} actor runs repeated, "
              f"{result['client_retries']} client retries", flush=True)
    if not rounds:
        sys.exit("no round completed")
    summary = {k: {"median": statistics.median(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
               for k in MEASURES}
    print(f"{'':18} {'median':>8} {'max':>8}")
    for k in MEASURES:
        print(f"{k:18} {summary[k]['median']:8.2f} {summary[k]['max']:8.2f}")
    print(json.dumps({"replication": "async" if args.asynchronous else "sync", "rounds": rounds,
                      "summary": summary}))


if __name__ == "__main__":
    main()
