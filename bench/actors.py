#!/usr/bin/env python
"""Actor benchmark: fan-out + queue + scheduler throughput, and idle latency.

For PostgreSQL and for SQLite, each scenario in a fresh database, one
process (``yoke.open(url, app=app)`` runs the executor in-process):

(a) throughput: ``--instances`` (100) instances of one actor whose
    ``process()`` does nothing but count; ``--events`` (20,000) events
    appended in batches of ``--batch`` (500) with ``append_many``.
    - live: the executor runs while the batches are appended; events/s from
      the first append call to ``wait_idle()`` returning (called once
      process() has counted every event, so its polling does not compete).
    - backlog (processing alone): the same events appended first by a
      runtime without an app; then a runtime with the app opens; events/s
      from opening it to ``wait_idle()`` returning (fan-out, claims,
      process(), completions; no appends competing).
(b) latency on an idle system (the instances of (a), nothing queued):
    ``--samples`` (300) sequential single-event appends, each waiting for
    its process() call; latency = time.time() at the start of process()
    minus time.time() just before the append call. p50 / p99.

How events reach the instances (``--routing``):
    type   each instance's filter is its own event type (type index lookup,
           no expression evaluated): measures the queue machinery. Default.
    key    a keyed actor, ``key="payload.k"``: one JSONata evaluation per event.
    where  each instance has ``where: payload.k = <i>``: routing on the
           payload, one filter per instance.

``--concurrency`` (4,1): the actor's concurrency, a row each.

Targets (concurrency 4, --routing key): (a) live >= 6,000 events/s on
PostgreSQL, 5,000 on SQLite; (b) p50 <= 5 ms, p99 <= 25 ms on both.

(c) ``--isolation``: the isolation row. The no-op actor of bench/hosts_app.py
    (type routing, ``--instances`` instances), once in-process and once in
    ``--hosts`` (4) host processes taking ``--host-runs`` (1) runs each at
    once (docs/hosts.md): live events/s as in (a),
    and append -> process() returned p50 / p99 as in (b). Both modes are
    measured the same way, by the scheduler's run hook in the kernel (a
    handler in a host cannot touch this script's counters), so latency here
    ends when the kernel sees process() return, not when it starts. Also
    the CPU time per event of the live phase (this process plus its hosts,
    from /proc): on a machine whose cores are busy with other work, waiting
    for a core dominates wall time, and a host run waits twice (the host,
    then the runtime); CPU per event is what bounds throughput without
    that contention.

``--profile`` (or ``--profile-only``) additionally profiles, on the first
backend and routing chosen: the idle latency (SQL statement and store
method timings, and the awaited calls of one median sample laid out on a
timeline) and the backlog scenario (the same timings plus cProfile of the
event loop thread). The timings come from wrappers installed by this script
around asyncpg's ``Connection`` query methods and the store's methods;
nothing in ``yoke/`` is changed.

PostgreSQL scenarios run in scratch databases created through
``YOKE_BENCH_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/postgres)
and dropped at the end; SQLite in a temporary directory, removed at the end.
The last line printed is one JSON object with every figure.

    python bench/actors.py [--backend all|postgres|sqlite] [--routing type,key,where]
                           [--events N] [--instances N] [--batch N] [--samples N]
                           [--profile | --profile-only] [--isolation [--hosts N]] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import io
import json
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

import yoke
from append import scratch  # bench/append.py (scripts run from bench/)
from yoke import App, Filter

TENANT = "bench"
ACTOR = "bench"
STREAM = "/bench"
WAIT_IDLE_S = 600.0
WARMUP_SAMPLES = 20


@dataclass(frozen=True)
class Config:
    instances: int
    events: int
    batch: int
    samples: int
    concurrency: int = 1  # the actor's concurrency: runs of one instance at once


# --- the application -----------------------------------------------------------


@dataclass
class Probe:
    """What process() records: counts and, for latency, the start times."""

    processed: int = 0
    first_start: float = 0.0
    last_end: float = 0.0
    waiters: dict[int, asyncio.Future[float]] = field(default_factory=dict)
    target: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def reset(self, target: int = 0) -> None:
        self.processed = 0
        self.first_start = self.last_end = 0.0
        self.target = target
        self.reached.clear()

    async def wait_then_idle(self, y: yoke.Runtime) -> None:
        """Wait for ``target`` process() calls in-process, then ``wait_idle()``
        (completions written). ``wait_idle`` alone polls a count over the
        whole queue every 20 ms, which competes for the database with the
        work being measured (see the report); it is still the end mark."""
        await asyncio.wait_for(self.reached.wait(), WAIT_IDLE_S)
        await y.wait_idle(timeout_s=WAIT_IDLE_S)


def make_app(routing: str, probe: Probe, concurrency: int = 1) -> App:
    app = App()
    actor_filter = Filter(types=["bench.work"], key="payload.k") if routing == "key" else None

    @app.actor(ACTOR, filter=actor_filter, concurrency=concurrency, max_attempts=5, timeout_s=30)
    async def process(ctx, event) -> None:  # noqa: ANN001
        now = time.time()
        if not probe.processed:
            probe.first_start = now
        probe.processed += 1
        if probe.processed == probe.target:
            probe.reached.set()
        waiter = probe.waiters.pop(event.payload.get("sample", -1), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        probe.last_end = time.time()

    return app


def instance_filter(routing: str, i: int) -> dict[str, Any] | None:
    if routing == "type":
        return {"types": [f"bench.work.{i}"]}
    if routing == "where":
        return {"types": ["bench.work"], "where": f"payload.k = {i}"}
    return None  # keyed: the actor's key routes


def event(routing: str, i: int, **payload: Any) -> dict[str, Any]:
    kind = f"bench.work.{i}" if routing == "type" else "bench.work"
    return {"type": kind, "payload": {"k": i, **payload}}


async def create_instances(y: yoke.Runtime, routing: str, count: int) -> None:
    for i in range(count):
        await y.instances(TENANT).create(ACTOR, key=str(i), filter=instance_filter(routing, i))


def batches(routing: str, cfg: Config) -> list[list[dict[str, Any]]]:
    events = [event(routing, n % cfg.instances, n=n) for n in range(cfg.events)]
    return [events[i : i + cfg.batch] for i in range(0, len(events), cfg.batch)]


# --- scenarios ------------------------------------------------------------------


@dataclass
class Result:
    backend: str
    routing: str
    concurrency: int = 1
    live_eps: float = 0.0
    live_append_s: float = 0.0
    live_total_s: float = 0.0
    backlog_eps: float = 0.0
    backlog_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    append_p50_ms: float = 0.0


def settings_for(folder: Path) -> dict[str, Any]:
    return {"data_dir": str(folder)}


async def live(url: str, routing: str, cfg: Config, folder: Path, result: Result) -> None:
    """(a) live: executor running while the batches are appended."""
    probe = Probe()
    app = make_app(routing, probe, cfg.concurrency)
    work = batches(routing, cfg)
    async with yoke.open(url, app=app, **settings_for(folder)) as y:
        await create_instances(y, routing, cfg.instances)
        stream = y.stream(STREAM, TENANT)
        # Warm-up outside the timing: one event per instance.
        await stream.append_many([event(routing, i, warm=True) for i in range(cfg.instances)])
        await y.wait_idle(timeout_s=WAIT_IDLE_S)
        probe.reset(cfg.events)
        start = time.perf_counter()
        for chunk in work:
            await stream.append_many(chunk)
        appended = time.perf_counter()
        await probe.wait_then_idle(y)
        done = time.perf_counter()
        assert probe.processed >= cfg.events, (probe.processed, cfg.events)
        result.live_append_s = appended - start
        result.live_total_s = done - start
        result.live_eps = cfg.events / (done - start)
        # (b) on the same, now idle, system.
        await latency(y, routing, cfg, probe, result)


async def latency(y: yoke.Runtime, routing: str, cfg: Config, probe: Probe, result: Result) -> None:
    stream = y.stream(STREAM, TENANT)
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    appends: list[float] = []
    for s in range(WARMUP_SAMPLES + cfg.samples):
        waiter: asyncio.Future[float] = loop.create_future()
        probe.waiters[s] = waiter
        before = time.time()
        await stream.append(event(routing, s % cfg.instances, sample=s))
        appended = time.time()
        started = await asyncio.wait_for(waiter, 30)
        if s >= WARMUP_SAMPLES:
            samples.append((started - before) * 1000)
            appends.append((appended - before) * 1000)
        await y.wait_idle(timeout_s=30)  # the row's completion too: the next sample starts idle
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    result.p50_ms, result.p99_ms, result.max_ms = cuts[49], cuts[98], max(samples)
    result.append_p50_ms = statistics.median(appends)


async def backlog(url: str, routing: str, cfg: Config, folder: Path, result: Result) -> None:
    """(a) processing alone: a backlog appended first, then the executor starts."""
    probe = Probe()
    probe.reset(cfg.events)
    app = make_app(routing, probe, cfg.concurrency)
    async with yoke.open(url, **settings_for(folder)) as y:  # no app: no executor
        await create_instances(y, routing, cfg.instances)
        stream = y.stream(STREAM, TENANT)
        for chunk in batches(routing, cfg):
            await stream.append_many(chunk)
    start = time.perf_counter()
    async with yoke.open(url, app=app, **settings_for(folder)) as y:
        await probe.wait_then_idle(y)
        done = time.perf_counter()
    assert probe.processed >= cfg.events, (probe.processed, cfg.events)
    result.backlog_s = done - start
    result.backlog_eps = cfg.events / (done - start)


# --- isolation ------------------------------------------------------------------


@dataclass
class IsolationResult:
    backend: str
    isolation: str
    live_eps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_ms_per_event: float = 0.0  # kernel process + hosts, during the live phase


def hosts_cpu_s(y: yoke.Runtime) -> float:
    """CPU seconds the runtime's host processes have used (Linux /proc)."""
    import os

    pool = y.executor.hosts if y.executor is not None else None
    total = 0
    for host in list(pool.hosts) if pool is not None else []:
        try:
            fields = open(f"/proc/{host.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


async def isolation_mode(backend: str, mode: str, cfg: Config, hosts: int, host_runs: int) -> IsolationResult:
    from hosts_app import app  # bench/hosts_app.py

    result = IsolationResult(backend, mode)
    done: dict[str, int] = {"count": 0, "target": 0}
    reached = asyncio.Event()
    waiters: dict[int, asyncio.Future[float]] = {}

    def on_run(row: Any, started: float, finished: float, ok: bool) -> None:
        done["count"] += 1
        if done["count"] == done["target"]:
            reached.set()
        waiter = waiters.pop((row.event.get("payload") or {}).get("sample", -1), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(finished)

    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=app, isolation=mode, host_processes=hosts, host_runs=host_runs,
                              **settings_for(folder)) as y:
            assert y.executor is not None
            y.executor.scheduler.on_run = on_run
            await create_instances(y, "type", cfg.instances)
            stream = y.stream(STREAM, TENANT)
            await stream.append_many([event("type", i, warm=True) for i in range(cfg.instances)])
            await y.wait_idle(timeout_s=WAIT_IDLE_S)
            done["count"], done["target"] = 0, cfg.events
            reached.clear()
            cpu_before = time.process_time() + hosts_cpu_s(y)
            start = time.perf_counter()
            for chunk in batches("type", cfg):
                await stream.append_many(chunk)
            await asyncio.wait_for(reached.wait(), WAIT_IDLE_S)
            await y.wait_idle(timeout_s=WAIT_IDLE_S)
            result.live_eps = cfg.events / (time.perf_counter() - start)
            cpu = time.process_time() + hosts_cpu_s(y) - cpu_before
            result.cpu_ms_per_event = cpu * 1000 / cfg.events
            loop = asyncio.get_running_loop()
            samples: list[float] = []
            for s in range(WARMUP_SAMPLES + cfg.samples):
                waiters[s] = loop.create_future()
                before = time.time()
                await stream.append(event("type", s % cfg.instances, sample=s))
                finished = await asyncio.wait_for(waiters[s], 30)
                if s >= WARMUP_SAMPLES:
                    samples.append((finished - before) * 1000)
                await y.wait_idle(timeout_s=30)
            cuts = statistics.quantiles(samples, n=100, method="inclusive")
            result.p50_ms, result.p99_ms = cuts[49], cuts[98]
    return result


# --- backends -------------------------------------------------------------------


async def run(backend: str, routing: str, cfg: Config) -> Result:
    result = Result(backend, routing, cfg.concurrency)
    async with scratch(backend) as (url, folder):
        await live(url, routing, cfg, folder, result)
    async with scratch(backend) as (url, folder):
        await backlog(url, routing, cfg, folder, result)
    return result


# --- profiling --------------------------------------------------------------------


class Timings:
    """Wall time of awaited calls, by label (count, total seconds, rows)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
        self.trace: list[tuple[float, float, str]] | None = None  # (start, end, label) when tracing

    def add(self, label: str, seconds: float, rows: int = 0) -> None:
        if self.trace is not None:
            end = time.time()
            self.trace.append((end - seconds, end, label))
        entry = self.calls[label]
        entry[0] += 1
        entry[1] += seconds
        entry[2] += rows

    def table(self, title: str, wall: float, top: int = 25) -> str:
        lines = [f"{title} (wall {wall:.2f}s; time is awaited wall time, calls overlap)",
                 f"  {'calls':>7} {'total s':>8} {'ms/call':>8} {'rows':>8}  what"]
        ranked = sorted(self.calls.items(), key=lambda kv: -kv[1][1])[:top]
        for label, (n, total, rows) in ranked:
            lines.append(f"  {n:>7} {total:>8.3f} {total / n * 1000:>8.3f} {rows:>8}  {label}")
        return "\n".join(lines)


def sql_label(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= 110 else text[:107] + "..."


@contextlib.contextmanager
def time_asyncpg(timings: Timings):  # noqa: ANN201
    """Wrap asyncpg's Connection query methods (pool proxies forward to them)."""
    conn_cls = asyncpg.connection.Connection
    originals = {name: getattr(conn_cls, name) for name in ("execute", "fetch", "fetchrow", "fetchval")}

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(self, query, *args, **kwargs):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            try:
                out = await original(self, query, *args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
            rows = len(out) if isinstance(out, list) else 0
            timings.add(sql_label(query), elapsed, rows)
            return out

        return timed

    for name, original in originals.items():
        setattr(conn_cls, name, wrap(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(conn_cls, name, original)


def time_methods(obj: Any, names: list[str], timings: Timings, prefix: str) -> None:
    for name in names:
        original = getattr(obj, name)

        async def timed(*args, __original=original, __name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                out = await __original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
            rows = len(out) if isinstance(out, list) else 0
            timings.add(f"{prefix}.{__name}", elapsed, rows)
            return out

        setattr(obj, name, timed)


ACTOR_STORE_METHODS = [
    "claim", "complete", "fail", "fanout_commit", "fanout_cursor", "fanout_lag", "unfinished",
    "tenants", "routing", "get_instance", "heartbeat", "reap_workers", "live_workers",
    "adopt_instances",
]


async def profile_backlog(backend: str, routing: str, cfg: Config) -> str:
    """The backlog scenario under cProfile, with SQL and store-method timings."""
    probe = Probe()
    probe.reset(cfg.events)
    app = make_app(routing, probe, cfg.concurrency)
    sql, methods = Timings(), Timings()
    out = io.StringIO()
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, **settings_for(folder)) as y:
            await create_instances(y, routing, cfg.instances)
            stream = y.stream(STREAM, TENANT)
            for chunk in batches(routing, cfg):
                await stream.append_many(chunk)
        profiler = cProfile.Profile()
        with time_asyncpg(sql):
            start = time.perf_counter()
            profiler.enable()
            async with yoke.open(url, app=app, **settings_for(folder)) as y:
                time_methods(y.store.actors, ACTOR_STORE_METHODS, methods, "actors")
                time_methods(y.store, ["read"], methods, "store")
                await probe.wait_then_idle(y)
                wall = time.perf_counter() - start
            profiler.disable()
    print(f"\n=== profile: {backend}, routing={routing}, backlog of {cfg.events} events,"
          f" {cfg.instances} instances: {wall:.2f}s, {cfg.events / wall:,.0f} events/s ===", file=out)
    print(methods.table("store methods", wall), file=out)
    if sql.calls:
        print(sql.table("SQL statements", wall), file=out)
    for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(key).print_stats(30)
        body = text.getvalue()
        body = body[body.find("   ncalls") :]
        print(f"python functions by {title} (cProfile; the event loop thread only):\n{body}", file=out)
    return out.getvalue()


async def profile_latency(backend: str, routing: str, cfg: Config) -> str:
    """Idle latency with SQL and store-method timings, and one traced sample."""
    probe = Probe()
    app = make_app(routing, probe, cfg.concurrency)
    sql, methods = Timings(), Timings()
    out = io.StringIO()
    samples = min(cfg.samples, 100)
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=app, **settings_for(folder)) as y:
            await create_instances(y, routing, cfg.instances)
            stream = y.stream(STREAM, TENANT)
            await stream.append_many([event(routing, i, warm=True) for i in range(cfg.instances)])
            await y.wait_idle(timeout_s=WAIT_IDLE_S)
            loop = asyncio.get_running_loop()
            lat: list[float] = []
            traces: list[tuple[float, float, list[tuple[float, float, str]]]] = []
            with time_asyncpg(sql):
                time_methods(y.store.actors, ACTOR_STORE_METHODS, methods, "actors")
                time_methods(y.store, ["read", "commit"], methods, "store")
                for s in range(WARMUP_SAMPLES + samples):
                    await y.wait_idle(timeout_s=30)
                    await asyncio.sleep(0.05)  # let the previous sample's stragglers settle
                    if s == WARMUP_SAMPLES:
                        sql.calls.clear()
                        methods.calls.clear()
                    trace: list[tuple[float, float, str]] = []
                    sql.trace = methods.trace = trace
                    waiter: asyncio.Future[float] = loop.create_future()
                    probe.waiters[10**6 + s] = waiter
                    before = time.time()
                    await stream.append(event(routing, s % cfg.instances, sample=10**6 + s))
                    started = await asyncio.wait_for(waiter, 30)
                    sql.trace = methods.trace = None
                    if s >= WARMUP_SAMPLES:
                        lat.append((started - before) * 1000)
                        traces.append((before, started, trace))
    wall = sum(lat) / 1000
    print(f"\n=== profile: {backend}, routing={routing}, idle latency, {samples} samples:"
          f" p50 {statistics.median(lat):.2f} ms ===", file=out)
    print(methods.table("store methods, over all samples (incl. completions and the wait_idle polls"
                        " between samples)", wall), file=out)
    if sql.calls:
        print(sql.table("SQL statements, same window", wall, top=30), file=out)
    median = sorted(traces, key=lambda t: t[1] - t[0])[len(traces) // 2]
    before, started, trace = median
    print(f"one median sample, {1000 * (started - before):.2f} ms from append call to process();"
          " awaited calls that started before process() did (ms from the append call):", file=out)
    for start, end, label in sorted(trace):
        if start <= started:
            print(f"  {1000 * (start - before):7.2f} -> {1000 * (end - before):7.2f}  {label}", file=out)
    return out.getvalue()


# --- main -------------------------------------------------------------------------


def print_table(results: list[Result], cfg: Config) -> None:
    head = (f"{'backend':<9}{'routing':<8}{'conc':>5}{'live ev/s':>11}{'append s':>10}{'total s':>9}"
            f"{'backlog ev/s':>14}{'backlog s':>11}{'lat p50 ms':>12}{'p99 ms':>9}{'max ms':>9}"
            f"{'append p50':>12}")
    print(f"\n{cfg.instances} instances, {cfg.events} events in batches of {cfg.batch};"
          f" latency over {cfg.samples} sequential appends (after {WARMUP_SAMPLES} warm-up)")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r.backend:<9}{r.routing:<8}{r.concurrency:>5}{r.live_eps:>11,.0f}{r.live_append_s:>10.2f}"
              f"{r.live_total_s:>9.2f}{r.backlog_eps:>14,.0f}{r.backlog_s:>11.2f}{r.p50_ms:>12.2f}"
              f"{r.p99_ms:>9.2f}{r.max_ms:>9.2f}{r.append_p50_ms:>12.2f}")
    for r in results:
        if r.concurrency != 4:
            continue
        floor = 6000 if r.backend == "postgres" else 5000
        for label, ok in (
            (f"(a) live >= {floor:,} events/s", r.live_eps >= floor),
            ("(b) p50 <= 5 ms", r.p50_ms <= 5),
            ("(b) p99 <= 25 ms", r.p99_ms <= 25),
        ):
            print(f"{r.backend:<8} {r.routing:<6} target {label:<32} {'met' if ok else 'MISSED'}")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("all", "postgres", "sqlite"), default="all")
    parser.add_argument("--routing", default="type",
                        help="comma-separated: type, key, where (default: type)")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--concurrency", default="4,1",
                        help="comma-separated actor concurrencies, a row each (default: 4,1)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile latency and backlog (first backend, first routing)")
    parser.add_argument("--profile-only", action="store_true", help="only the profile")
    parser.add_argument("--quick", action="store_true", help="2,000 events, 50 latency samples")
    parser.add_argument("--isolation", action="store_true",
                        help="only the isolation row: in-process and in host processes")
    parser.add_argument("--hosts", type=int, default=4, help="host processes for --isolation")
    parser.add_argument("--host-runs", type=int, default=1, help="runs one host takes at once (--isolation)")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.samples = 2000, 50
    cfg = Config(args.instances, args.events, args.batch, args.samples)
    routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not set(routings) <= {"type", "key", "where"}:
        parser.error("--routing takes type, key and/or where")
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]

    if args.isolation:
        rows = []
        for backend in backends:
            modes = {}
            for mode in ("inprocess", "process"):
                modes[mode] = r = await isolation_mode(backend, mode, cfg, args.hosts, args.host_runs)
                print(f"{backend} isolation={mode}: live {r.live_eps:,.0f} ev/s,"
                      f" append -> process() returned p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms;"
                      f" CPU {r.cpu_ms_per_event:.3f} ms/event (runtime + hosts)", flush=True)
                rows.append(r.__dict__)
            ratio = modes["process"].live_eps / modes["inprocess"].live_eps
            cpu_ratio = modes["inprocess"].cpu_ms_per_event / modes["process"].cpu_ms_per_event
            print(f"{backend}: isolated throughput {ratio:.0%} of in-process; by CPU per event"
                  f" (the bound on an otherwise idle machine) {cpu_ratio:.0%}", flush=True)
        print(json.dumps(rows), flush=True)
        return

    results: list[Result] = []
    if not args.profile_only:
        for backend in backends:
            for routing, concurrency in [(r, c) for r in routings for c in concurrencies]:
                r = await run(backend, routing, dataclasses.replace(cfg, concurrency=concurrency))
                print(f"{backend} {routing} concurrency {concurrency}: live {r.live_eps:,.0f} ev/s, backlog {r.backlog_eps:,.0f}"
                      f" ev/s, latency p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms", flush=True)
                results.append(r)
        print_table(results, cfg)
    if args.profile or args.profile_only:
        print(await profile_latency(backends[0], routings[0], cfg), flush=True)
        print(await profile_backlog(backends[0], routings[0], cfg), flush=True)
    print(json.dumps([r.__dict__ for r in results]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
