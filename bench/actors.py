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
    once (docs/advanced/hosts.md): live events/s as in (a),
    and append -> process() returned p50 / p99 as in (b). Both modes are
    measured the same way, by the scheduler's run hook in the kernel (a
    handler in a host cannot touch this script's counters), so latency here
    ends when the kernel sees process() return, not when it starts. Also
    the CPU time per event of the live phase (this process plus its hosts,
    from /proc): on a machine whose cores are busy with other work, waiting
    for a core dominates wall time, and a host run waits twice (the host,
    then the runtime); CPU per event is what bounds throughput without
    that contention.

(e) ``--effects default,atomic``: the effects rows. An actor whose
    ``process()`` updates its state and appends one event (type routing,
    ``--instances`` instances, concurrency 1), in each effects mode
    (docs/advanced/effects.md), on the backend's default storage (file on SQLite,
    pg_sqlite on PostgreSQL): live events/s as in (a), and append -> run
    finished p50 / p99 from the scheduler's run hook (an atomic run's
    commit is part of its run).

(d) ``--workers 1,2,3``: several workers on one PostgreSQL (SQLite is
    refused). For each count N and each phase, a fresh scratch database and N
    real ``yoke worker --app workers_app:app`` processes (bench/workers_app.py:
    the keyed actor of (a), a process() that does nothing, ``--concurrency``
    4 unless given). This process opens the database without an executor,
    creates the ``--instances`` instances and appends; it sees completion
    through the store's count of unfinished work (events not fanned out,
    queue rows pending or processing: what ``wait_idle`` ends on), polled
    every 20-250 ms. Phases:
    - live: the workers run and have adopted the instances (created once
      every worker has registered, so each takes a fair share); events/s
      from the first append call to nothing left.
    - resumed: the same start, then the workers are stopped (SIGSTOP) while
      every batch is appended and continued (SIGCONT); events/s from SIGCONT
      to nothing left: processing alone, the instances spread.
    - backlog: every batch appended with no worker running, then the N
      workers start; events/s from the first worker running (its ``--json``
      line) to nothing left. The first worker up may take every instance;
      the workers then share them (a worker gives up what it owns beyond
      ceil(instances / workers) as others join, docs/basics/actors.md): the
      row says how they were spread at the end.
    Per row: CPU seconds of the workers, of the PostgreSQL backends of the
    scratch database (processes whose /proc/PID/stat names ``postgres`` and
    whose title names the database: the workers' connections and this
    process's), of the other postgres processes
    (background writers; other databases: someone else's work) and of this
    process; "cores busy" is the first three over the wall time: at the
    machine's core count, the shared cores are the bound. Workers stop with
    SIGTERM (their exit codes are printed; they also get SIGTERM should this
    script die). ``--profile-worker`` samples the worker owning the most
    instances with py-spy during each timed phase and prints its own and
    cumulative time by function; py-spy is not a dependency (install it by
    hand: ``.venv/bin/pip install py-spy``), and its sampling takes CPU from
    the same cores, so take figures from runs without it.

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
    python bench/actors.py --workers 1,2,3 [--events N] [--concurrency N] [--profile-worker] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import ctypes
import dataclasses
import io
import json
import os
import pstats
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
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
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


# --keep-inputs: the actor's keep_inputs (None: every input kept, the default;
# 0: none written, docs/advanced/forks.md#what-it-costs).
KEEP_INPUTS: int | None = None
# --state: each run also adds to its instance's durable state (with keyed
# routing and many instances: what a new instance's database costs).
WRITE_STATE = False


def make_app(routing: str, probe: Probe, concurrency: int = 1) -> App:
    app = App()
    actor_filter = Filter(types=["bench.work"], key="payload.k") if routing == "key" else None

    @app.actor(ACTOR, filter=actor_filter, concurrency=concurrency, max_attempts=5, timeout_s=30,
               keep_inputs=KEEP_INPUTS)
    async def process(ctx, event) -> None:  # noqa: ANN001
        if WRITE_STATE:
            await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1})
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
    pool = y.executor.hosts if y.executor is not None else None
    total = 0
    for host in list(pool.hosts) if pool is not None else []:
        try:
            fields = open(f"/proc/{host.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / CLK_TCK


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


# --- effects (--effects) ----------------------------------------------------------


@dataclass
class EffectsResult:
    backend: str
    effects: str
    storage: str
    live_eps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0


def effects_app(effects: str) -> App:
    """Type routing; process() counts in ctx.state and appends one event: a
    state write and an append per run, in ``effects`` mode."""
    app = App()

    @app.actor(ACTOR, concurrency=1, max_attempts=5, timeout_s=30, effects=effects)
    async def process(ctx, event) -> None:  # noqa: ANN001
        await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1})
        await ctx.append({"type": "bench.done", "payload": {"k": event.payload.get("k")}}, "/bench-out")

    return app


async def effects_mode(backend: str, effects: str, cfg: Config) -> EffectsResult:
    """Live events/s as in (a), and append -> run finished p50 / p99 (the
    scheduler's run hook: after the atomic commit, which is part of the run;
    in the default mode the effects are durable when process() returns)."""
    result = EffectsResult(backend, effects, "pg_sqlite" if backend == "postgres" else "file")
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
        async with yoke.open(url, app=effects_app(effects), **settings_for(folder)) as y:
            assert y.executor is not None
            y.executor.scheduler.on_run = on_run
            await create_instances(y, "type", cfg.instances)
            stream = y.stream(STREAM, TENANT)
            await stream.append_many([event("type", i, warm=True) for i in range(cfg.instances)])
            await y.wait_idle(timeout_s=WAIT_IDLE_S)
            done["count"], done["target"] = 0, cfg.events
            reached.clear()
            start = time.perf_counter()
            for chunk in batches("type", cfg):
                await stream.append_many(chunk)
            await asyncio.wait_for(reached.wait(), WAIT_IDLE_S)
            await y.wait_idle(timeout_s=WAIT_IDLE_S)
            result.live_eps = cfg.events / (time.perf_counter() - start)
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


# --- several workers (--workers) --------------------------------------------------

WORKER_APP = "workers_app:app"  # bench/workers_app.py, imported by the workers from bench/
BENCH_DIR = Path(__file__).resolve().parent
WORKER_READY_S = 120.0  # spawn to the worker's JSON line (imports, migrations check, registration)
WORKER_STOP_S = 40.0  # SIGTERM to exit: shutdown_timeout_s (10) and margin on busy cores
OWNED_S = 30.0  # instances adopted (at the workers' heartbeats, every second)
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # resolved here: the child runs no imports between fork and exec


def die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when this script ends, however it
    ends (a crash or a kill must not leave workers behind)."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def proc_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat as [comm, state, ppid, ...]; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    close = text.rindex(")")
    return [text[text.index("(") + 1 : close], *text[close + 2 :].split()]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one live process (0 once it is gone)."""
    stat = proc_stat(pid)
    return 0.0 if stat is None else (int(stat[12]) + int(stat[13])) / CLK_TCK


def postgres_cpu_s(database: str) -> tuple[float, float]:
    """CPU seconds of PostgreSQL's processes (those whose /proc/PID/stat
    names ``postgres``): (the backends connected to ``database``, every
    postgres process). The second counts exited backends too (in the
    postmaster's children's time), so it never goes back; the first loses a
    backend that exits, which the workers' and this script's pools do not
    during a phase."""
    mine = everything = 0
    tag = f" {database} ".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = proc_stat(entry)
        if stat is None or stat[0] != "postgres":
            continue
        ticks = int(stat[12]) + int(stat[13])
        everything += ticks + int(stat[14]) + int(stat[15])  # + its exited children's
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read()  # "postgres: 15/main: USER DATABASE HOST(PORT) STATE"
        except OSError:
            continue
        if tag in title:
            mine += ticks
    return mine / CLK_TCK, everything / CLK_TCK


@dataclass
class Worker:
    """One ``yoke worker`` process started by this script."""

    proc: asyncio.subprocess.Process
    log: Path
    worker_id: str = ""
    ready_at: float = 0.0  # perf_counter when its JSON line arrived
    cpu_at_ready: float = 0.0

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


async def start_worker(url: str, folder: Path, index: int, concurrency: int, extra_env: dict[str, str]) -> Worker:
    env = {**os.environ, "BENCH_ACTOR_CONCURRENCY": str(concurrency), "YOKE_DATA_DIR": str(folder), **extra_env}
    log = folder / f"worker{index}.log"
    with open(log, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "yoke.cli", "worker", "--app", WORKER_APP, "--db", url, "--json",
            cwd=BENCH_DIR, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=err, preexec_fn=die_with_parent,
        )
    return Worker(proc, log)


async def wait_ready(worker: Worker, on_ready: Callable[[], None]) -> None:
    """Until the worker prints its JSON line (its executor runs: registered,
    fan-out and scheduler started)."""
    assert worker.proc.stdout is not None
    try:
        line = await asyncio.wait_for(worker.proc.stdout.readline(), WORKER_READY_S)
    except TimeoutError:
        raise RuntimeError(f"worker pid {worker.proc.pid} not ready after {WORKER_READY_S}s:\n"
                           f"{worker.log_tail()}") from None
    if not line:
        await worker.proc.wait()
        raise RuntimeError(f"worker pid {worker.proc.pid} exited ({worker.proc.returncode}) before it ran:\n"
                           f"{worker.log_tail()}")
    worker.ready_at = time.perf_counter()
    worker.cpu_at_ready = cpu_s(worker.proc.pid)
    worker.worker_id = json.loads(line)["worker_id"]
    on_ready()


async def stop_workers(workers: list[Worker]) -> list[int]:
    """SIGTERM (a graceful stop), then the exit codes; a worker still there
    after WORKER_STOP_S is killed and reported as -9."""
    for w in workers:
        if w.proc.returncode is None:
            w.proc.send_signal(signal.SIGTERM)
            w.proc.send_signal(signal.SIGCONT)  # one stopped by the resumed phase must see it
    codes = []
    for w in workers:
        try:
            codes.append(await asyncio.wait_for(w.proc.wait(), WORKER_STOP_S))
        except TimeoutError:
            w.proc.kill()
            await w.proc.wait()
            codes.append(-9)
            print(f"worker pid {w.proc.pid} did not stop within {WORKER_STOP_S}s of SIGTERM:"
                  f"\n{w.log_tail()}", file=sys.stderr, flush=True)
    return codes


@contextlib.asynccontextmanager
async def worker_fleet(url: str, folder: Path, count: int, concurrency: int, exit_codes: list[int],
                       on_first_ready: Callable[[], None] = lambda: None,
                       extra_env: dict[str, str] | None = None):  # noqa: ANN201
    """``count`` workers on ``url``, yielded once every one runs; stopped with
    SIGTERM on the way out (their exit codes appended to ``exit_codes``)."""
    workers: list[Worker] = []
    try:
        for i in range(count):
            workers.append(await start_worker(url, folder, i, concurrency, extra_env or {}))
        first = [True]

        def ready() -> None:
            if first[0]:
                first[0] = False
                on_first_ready()

        await asyncio.gather(*(wait_ready(w, ready) for w in workers))
        yield workers
    finally:
        exit_codes.extend(await stop_workers(workers))


async def owners(y: yoke.Runtime) -> Counter[str | None]:
    """Instances of the bench actor by owning worker (None: unowned)."""
    counts: Counter[str | None] = Counter()
    after = None
    while True:
        page = await y.instances(TENANT).list(ACTOR, limit=100, after=after)
        counts.update(i.worker_id for i in page)
        if len(page) < 100:
            return counts
        after = page[-1].instance_id


async def wait_owned(y: yoke.Runtime) -> Counter[str | None]:
    """Until every instance has an owner (workers adopt unowned instances
    at their heartbeats, up to a fair share of the live workers)."""
    deadline = time.monotonic() + OWNED_S
    while True:
        counts = await owners(y)
        if None not in counts:
            return counts
        if time.monotonic() > deadline:
            raise RuntimeError(f"instances still unowned after {OWNED_S}s: {dict(counts)}")
        await asyncio.sleep(0.1)


async def drained(y: yoke.Runtime) -> float:
    """perf_counter once no event waits for fan-out and no queue row is
    pending or processing (the store's count that ``wait_idle`` ends on;
    this runtime has no executor). The count scans the queue, so it is
    polled sparingly while much is left, and every 20 ms near the end:
    the interval is half the time the last polls' rate says is left."""
    deadline = time.monotonic() + WAIT_IDLE_S
    last: tuple[float, int] | None = None
    interval = 0.05
    while True:
        left = await y.store.actors.unfinished([ACTOR])
        now = time.perf_counter()
        if left == 0:
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} rows or events still unfinished after {WAIT_IDLE_S}s")
        if last is not None and last[1] > left:
            rate = (last[1] - left) / (now - last[0])
            interval = min(max(left / rate / 2, 0.02), 0.25)
        last = (now, left)
        await asyncio.sleep(interval)


@dataclass
class Usage:
    """CPU seconds so far: workers, PostgreSQL (this database / all), this process."""

    at: float
    workers: list[float]
    pg: float
    pg_all: float
    bench: float

    @classmethod
    def now(cls, workers: list[Worker], database: str) -> Usage:
        pg, pg_all = postgres_cpu_s(database)
        used = [cpu_s(w.proc.pid) for w in workers]
        return cls(time.perf_counter(), used, pg, pg_all, time.process_time())


@dataclass
class WorkersResult:
    workers: int
    phase: str  # live | resumed | backlog
    concurrency: int
    events: int
    events_per_s: float = 0.0
    seconds: float = 0.0
    append_s: float = 0.0  # live, resumed: first append call to the last one returning
    start_s: float = 0.0  # backlog: spawning the workers to the last one running
    worker_cpu_s: float = 0.0
    worker_cpu_each: list[float] = field(default_factory=list)  # by worker, as started: an idle one shows
    pg_cpu_s: float = 0.0  # backends of the scratch database
    pg_other_cpu_s: float = 0.0  # every other postgres process: background writers, other databases
    bench_cpu_s: float = 0.0  # this process: the appends (live), the drain polls
    cores_busy: float = 0.0  # (workers + pg + bench) CPU seconds per wall second
    cpu_ms_per_event: float = 0.0  # the same CPU over the events
    owners: list[int] = field(default_factory=list)  # instances per worker, as started
    exit_codes: list[int] = field(default_factory=list)
    load_1m: float = 0.0  # the machine's load average as the phase started
    profile: str = ""  # --profile-worker: the summarised py-spy samples of the busiest worker

    def measure(self, before: Usage, after: Usage, start: float, done: float) -> None:
        self.seconds = done - start
        self.events_per_s = self.events / self.seconds
        self.worker_cpu_each = [round(a - b, 3) for a, b in zip(after.workers, before.workers, strict=True)]
        self.worker_cpu_s = sum(self.worker_cpu_each)
        self.pg_cpu_s = after.pg - before.pg
        self.pg_other_cpu_s = max(0.0, round((after.pg_all - before.pg_all) - self.pg_cpu_s, 3))  # no -0.00
        self.bench_cpu_s = after.bench - before.bench
        used = self.worker_cpu_s + self.pg_cpu_s + self.bench_cpu_s
        self.cores_busy = used / (after.at - before.at)
        self.cpu_ms_per_event = used * 1000 / self.events


def database_of(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path.lstrip("/")


def ownership(counts: Counter[str | None], workers: list[Worker]) -> list[int]:
    """Instances per worker, in the order the workers were started."""
    return [counts.get(w.worker_id, 0) for w in workers]


async def profiled(y: yoke.Runtime, workers: list[Worker], path: Path) -> Profiler:
    """py-spy on the worker that owns the most instances (an idle one says nothing)."""
    counts = await owners(y)
    busiest = max(workers, key=lambda w: counts.get(w.worker_id, 0))
    profiler = Profiler(busiest.proc.pid, workers.index(busiest) + 1, path)
    await profiler.start()
    return profiler


class Profiler:
    """py-spy attached to one worker (``--profile-worker``): raw stacks
    (collapsed, one line per stack with its sample count) in ``path``."""

    def __init__(self, pid: int, number: int, path: Path) -> None:
        self.pid, self.number, self.path = pid, number, path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            py_spy(), "record", "--pid", str(self.pid), "--rate", "200", "--nonblocking",
            "--format", "raw", "--full-filenames", "--output", str(self.path),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, preexec_fn=die_with_parent,
        )

    async def stop(self) -> str:
        """Stop sampling (SIGINT: py-spy writes its output) and summarise."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(self.proc.communicate(), 60)
        if not self.path.exists():
            return f"(py-spy wrote nothing: {err.decode(errors='replace').strip()})"
        return f"worker {self.number} (pid {self.pid}): " + summarise_stacks(self.path.read_text())


def py_spy() -> str:
    import shutil

    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile-worker needs py-spy, which Yoke does not depend on: install it"
                         " by hand for the run (.venv/bin/pip install py-spy)")
    return found


def summarise_stacks(raw: str, top: int = 20) -> str:
    """Own and cumulative sample shares by function, from py-spy's raw
    format (``frame;frame;...;leaf COUNT``, frames ``function (file:line)``)."""
    own: Counter[str] = Counter()
    total_of: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for name in set(frames):
            total_of[name] += n
    if not total:
        return "(no samples)"
    lines = [f"{total} samples of the worker on a CPU (py-spy, 200/s)", "  own %  function"]
    lines += [f"  {100 * n / total:5.1f}  {name}" for name, n in own.most_common(top)]
    # Frames in nearly every sample (the CLI, asyncio.run, the loop's
    # _run_once) say nothing: left out.
    branches = [(name, n) for name, n in total_of.most_common() if n < 0.9 * total][:top]
    lines += ["  cumulative %  function (frames in 90% of the samples or more left out: the event loop)"]
    lines += [f"  {100 * n / total:12.1f}  {name}" for name, n in branches]
    return "\n".join(lines)


def frame_name(frame: str) -> str:
    """``claim (/.../yoke/store/postgres/actors.py:123)`` -> ``claim (yoke/store/postgres/actors.py)``:
    no line, paths from the package (``stdlib/`` for the standard library's)."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].rstrip(")")
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/lib/python3." in path:
        path = "stdlib/" + path.split("/lib/python3.", 1)[1].split("/", 1)[-1]
    elif "/yoke/" in path:
        path = "yoke/" + path.rsplit("/yoke/", 1)[1]
    return f"{name} ({path})"


async def workers_live(url: str, folder: Path, n: int, cfg: Config, profile: bool) -> WorkersResult:
    """Live: the workers run; this process (no executor) appends the batches.
    Events/s from the first append call to the store reporting nothing left."""
    from workers_app import app  # bench/workers_app.py

    result = WorkersResult(n, "live", cfg.concurrency, cfg.events)
    database = database_of(url)
    work = batches("key", cfg)
    async with yoke.open(url, app=app, executor=False, **settings_for(folder)) as y:  # migrates first
        async with worker_fleet(url, folder, n, cfg.concurrency, result.exit_codes) as workers:
            # Created once every worker is registered: each adopts a fair share.
            await create_instances(y, "key", cfg.instances)
            await wait_owned(y)
            stream = y.stream(STREAM, TENANT)
            await stream.append_many([event("key", i, warm=True) for i in range(cfg.instances)])
            await drained(y)
            profiler = await profiled(y, workers, folder / "live.stacks") if profile else None
            result.load_1m = os.getloadavg()[0]
            before = Usage.now(workers, database)
            start = time.perf_counter()
            for chunk in work:
                await stream.append_many(chunk)
            result.append_s = time.perf_counter() - start
            done = await drained(y)
            result.measure(before, Usage.now(workers, database), start, done)
            if profiler is not None:
                result.profile = await profiler.stop()
            result.owners = ownership(await owners(y), workers)
    return result


async def workers_backlog(url: str, folder: Path, n: int, cfg: Config, profile: bool) -> WorkersResult:
    """Backlog: every batch appended with no worker running, then the
    workers start; events/s from the first worker running (its JSON line)
    to the store reporting nothing left. Each worker's CPU counts from its
    own JSON line (not its imports)."""
    from workers_app import app

    result = WorkersResult(n, "backlog", cfg.concurrency, cfg.events)
    database = database_of(url)
    async with yoke.open(url, app=app, executor=False, **settings_for(folder)) as y:
        await create_instances(y, "key", cfg.instances)
        stream = y.stream(STREAM, TENANT)
        for chunk in batches("key", cfg):
            await stream.append_many(chunk)
        marks: dict[str, Any] = {}

        def first_ready() -> None:
            pg, pg_all = postgres_cpu_s(database)
            marks.update(at=time.perf_counter(), pg=pg, pg_all=pg_all, bench=time.process_time())

        result.load_1m = os.getloadavg()[0]
        spawned = time.perf_counter()
        async with worker_fleet(url, folder, n, cfg.concurrency, result.exit_codes, first_ready) as workers:
            result.start_s = max(w.ready_at for w in workers) - spawned
            profiler = await profiled(y, workers, folder / "backlog.stacks") if profile else None
            done = await drained(y)
            before = Usage(marks["at"], [w.cpu_at_ready for w in workers], marks["pg"], marks["pg_all"],
                           marks["bench"])
            result.measure(before, Usage.now(workers, database), marks["at"], done)
            if profiler is not None:
                result.profile = await profiler.stop()
            result.owners = ownership(await owners(y), workers)
    return result


async def workers_resumed(url: str, folder: Path, n: int, cfg: Config, profile: bool) -> WorkersResult:
    """Processing alone, the instances spread: the workers start and adopt
    a fair share as in live, are stopped (SIGSTOP) while every batch is
    appended, then continued (SIGCONT); events/s from SIGCONT to the store
    reporting nothing left. (Stopped workers do not heartbeat: they are
    told to take one another for dead only after 10 minutes, not 10 s.)"""
    from workers_app import app

    result = WorkersResult(n, "resumed", cfg.concurrency, cfg.events)
    database = database_of(url)
    async with yoke.open(url, app=app, executor=False, **settings_for(folder)) as y:
        async with worker_fleet(url, folder, n, cfg.concurrency, result.exit_codes,
                                extra_env={"YOKE_WORKER_STALE_S": "600"}) as workers:
            await create_instances(y, "key", cfg.instances)
            await wait_owned(y)
            stream = y.stream(STREAM, TENANT)
            await stream.append_many([event("key", i, warm=True) for i in range(cfg.instances)])
            await drained(y)
            for w in workers:
                w.proc.send_signal(signal.SIGSTOP)
            try:
                started = time.perf_counter()
                for chunk in batches("key", cfg):
                    await stream.append_many(chunk)
                result.append_s = time.perf_counter() - started
                result.load_1m = os.getloadavg()[0]
                before = Usage.now(workers, database)
                start = time.perf_counter()
            finally:
                for w in workers:
                    w.proc.send_signal(signal.SIGCONT)
            profiler = await profiled(y, workers, folder / "resumed.stacks") if profile else None
            done = await drained(y)
            result.measure(before, Usage.now(workers, database), start, done)
            if profiler is not None:
                result.profile = await profiler.stop()
            result.owners = ownership(await owners(y), workers)
    return result


async def workers_mode(counts: list[int], cfg: Config, profile: bool) -> list[WorkersResult]:
    results = []
    for n in counts:
        for phase in (workers_live, workers_resumed, workers_backlog):
            async with scratch("postgres") as (url, folder):
                r = await phase(url, folder, n, cfg, profile)
            results.append(r)
            print(f"{n} worker(s) {r.phase}: {r.events_per_s:,.0f} ev/s in {r.seconds:.2f}s; CPU s: workers"
                  f" {r.worker_cpu_s:.2f} {r.worker_cpu_each}, postgres {r.pg_cpu_s:.2f} (+{r.pg_other_cpu_s:.2f} other),"
                  f" this process {r.bench_cpu_s:.2f}; {r.cores_busy:.2f} cores busy; instances per worker"
                  f" {r.owners}; exit codes {r.exit_codes}", flush=True)
            if r.profile:
                print(f"\n=== profile: {n} worker(s), {r.phase} ===\n{r.profile}\n", flush=True)
    return results


def print_workers_table(results: list[WorkersResult], cfg: Config) -> None:
    print(f"\n{cfg.instances} keyed instances, concurrency {cfg.concurrency}, {cfg.events} events in batches"
          f" of {cfg.batch}; {os.cpu_count()} cores shared by the workers, PostgreSQL and this process")
    head = (f"{'workers':>7} {'phase':<8}{'ev/s':>8}{'x N=1':>7}{'wall s':>8}{'CPU s: workers':>16}"
            f"{'postgres':>10}{'this':>7}{'other pg':>10}{'cores busy':>12}{'CPU ms/ev':>11}"
            f"{'load':>6}  instances per worker")
    print(head)
    print("-" * len(head))
    base = {r.phase: r.events_per_s for r in results if r.workers == 1}
    for r in results:
        ratio = f"{r.events_per_s / base[r.phase]:.2f}" if r.phase in base else "-"
        print(f"{r.workers:>7} {r.phase:<8}{r.events_per_s:>8,.0f}{ratio:>7}{r.seconds:>8.2f}"
              f"{r.worker_cpu_s:>16.2f}{r.pg_cpu_s:>10.2f}{r.bench_cpu_s:>7.2f}{r.pg_other_cpu_s:>10.2f}"
              f"{r.cores_busy:>12.2f}{r.cpu_ms_per_event:>11.3f}{r.load_1m:>6.1f}  {r.owners}")
    unclean = [(r.workers, r.phase, r.exit_codes) for r in results if any(r.exit_codes)]
    if unclean:
        print(f"workers that did not exit 0 on SIGTERM: {unclean}")


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
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated actor concurrencies, a row each (default: 4,1; --workers: 4)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile latency and backlog (first backend, first routing)")
    parser.add_argument("--profile-only", action="store_true", help="only the profile")
    parser.add_argument("--quick", action="store_true", help="2,000 events, 50 latency samples")
    parser.add_argument("--keep-inputs", type=int, default=None, metavar="N",
                        help="the actor's keep_inputs (default: keep every input; 0: write none)")
    parser.add_argument("--state", action="store_true",
                        help="each run also updates its instance's durable state (ctx.state.update)")
    parser.add_argument("--isolation", action="store_true",
                        help="only the isolation row: in-process and in host processes")
    parser.add_argument("--hosts", type=int, default=4, help="host processes for --isolation")
    parser.add_argument("--host-runs", type=int, default=1, help="runs one host takes at once (--isolation)")
    parser.add_argument("--effects", default=None, metavar="MODE,MODE",
                        help="only the effects rows: an actor that writes its state and appends once per"
                             " event, in each mode (default, atomic; docs/advanced/effects.md)")
    parser.add_argument("--workers", default=None, metavar="N,N,...",
                        help="only the several-workers rows: N `yoke worker` processes on one PostgreSQL"
                             " database, keyed routing (e.g. 1,2,3)")
    parser.add_argument("--profile-worker", action="store_true",
                        help="--workers: sample the busiest worker with py-spy (installed by hand) and"
                             " print its profile; the figures of such a run are not the clean ones")
    args = parser.parse_args(argv)
    global KEEP_INPUTS, WRITE_STATE
    KEEP_INPUTS, WRITE_STATE = args.keep_inputs, args.state
    if args.quick:
        args.events, args.samples = 2000, 50
    cfg = Config(args.instances, args.events, args.batch, args.samples)
    routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    if not set(routings) <= {"type", "key", "where"}:
        parser.error("--routing takes type, key and/or where")
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    default_concurrency = "4" if args.workers is not None else "4,1"
    try:
        concurrencies = [int(c) for c in (args.concurrency or default_concurrency).split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency takes comma-separated whole numbers, like 4,1")

    if args.workers is not None:
        if args.backend == "sqlite":
            parser.error("--workers runs on PostgreSQL only: processes on one SQLite file share its one"
                         " write lock and see each other's appends only at the periodic sweep"
                         " (docs/production/scaling.md); use --backend postgres (or leave --backend out)")
        try:
            counts = [int(n) for n in args.workers.split(",") if n.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            parser.error("--workers takes comma-separated worker counts of at least 1, like 1,2,3")
        if args.profile_worker:
            py_spy()  # missing: say so before any database is made
        results = []
        for concurrency in concurrencies:
            results += await workers_mode(counts, dataclasses.replace(cfg, concurrency=concurrency),
                                          args.profile_worker)
        for concurrency in concurrencies:
            print_workers_table([r for r in results if r.concurrency == concurrency],
                                dataclasses.replace(cfg, concurrency=concurrency))
        print(json.dumps([{k: round(v, 4) if isinstance(v, float) else v for k, v in r.__dict__.items()
                           if k != "profile"} for r in results]), flush=True)
        return
    if args.profile_worker:
        parser.error("--profile-worker goes with --workers")

    if args.effects is not None:
        modes = [m.strip() for m in args.effects.split(",") if m.strip()]
        if not modes or not set(modes) <= {"default", "atomic"}:
            parser.error("--effects takes default and/or atomic")
        rows = []
        for backend in backends:
            for mode in modes:
                r = await effects_mode(backend, mode, cfg)
                print(f"{backend} ({r.storage} storage) effects={mode}: live {r.live_eps:,.0f} ev/s,"
                      f" append -> run finished p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms", flush=True)
                rows.append(r.__dict__)
        print(json.dumps(rows), flush=True)
        return

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
    if os.environ.get("YOKE_TRACING") == "otlp":  # bench/tracing.py: the provider yoke serve would install
        from yoke import tracing

        tracing.install_otlp()
    asyncio.run(main(sys.argv[1:]))
