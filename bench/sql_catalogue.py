#!/usr/bin/env python
"""SQL catalogue benchmark: one read-only query across every actor
instance's tables (``y.sql``, yoke/catalogue.py), at scale, and what keeping
the mirror costs the actors.

Per backend and storage of the instance databases (SQLite with file
storage; PostgreSQL with pg_sqlite, file and s3 storage; s3 against moto's
standalone server, started here as the tests start it, if moto is
installed), each in a fresh database, one process (``yoke.open(url,
app=app)`` runs the executor in-process):

(1) scale: ``--instances`` (10,000) instances of the keyed actor "order"
    (``Filter(key="payload.k")``), each created by its first event, whose
    ``process()`` creates ``orders(id INTEGER PRIMARY KEY, status TEXT,
    total REAL, sku TEXT)`` and inserts its ``--rows`` (100) rows in one
    statement (a recursive CTE): 1,000,000 rows. The events are appended
    in batches of ``--batch`` (500); load time runs from the first append
    to every event processed and ``wait_idle()`` returning ("processed"),
    then to ``sql_settled()`` returning ("mirrored": the rows in the
    mirror). Row i of every instance has status ('new', 'paid', 'shipped',
    'cancelled')[i % 4] and total i / 2, so the answer of the aggregate is
    known; the later updates change ``sku`` alone and keep it so.
(2) idle: ``SELECT status, count(*), sum(total) FROM "order".orders GROUP
    BY status`` (``--agg-runs`` (10) runs after one warm-up; every answer
    checked) [target: under 1 s] and ``SELECT * FROM "order".orders WHERE
    key = ?`` for a random key (``--lookups`` (200) runs after 10 warm-up;
    each must return ``--rows`` rows) [under 50 ms]: p50 / p99 / max.
(3) the same two while a background producer appends ``--rate`` (1,000)
    events/s, each updating ``sku`` of one row of a random instance
    (``append_many`` of whatever is due every 5 ms), but never more than
    ``--max-backlog`` (250) events ahead of the actors (so where they cannot
    keep up the rate achieved is what they sustain, and a marker of (4)
    waits behind a bounded queue); measured after ``--warmup-s`` (3)
    seconds of load. The rate achieved is reported: events appended and
    processed per second over the window of (3) and (4), the share of the
    time the producer was held back by the cap, the backlog at the end.
(4) freshness, with the load of (3) still running: ``--fresh`` (120)
    samples, one after another; each appends one event that sets a unique
    marker in one row of a random instance, then polls ``SELECT sku FROM
    "order".orders WHERE key = ? AND id = ?`` every ``--poll-ms`` (5) ms
    until it answers the marker. Freshness = append returned -> the query
    saw it [target: p99 within 1 s]; split into append returned ->
    ``process()`` returned (the actor) and the rest (the mirror and the
    polling's granularity).
(5) cost to the actors, each mode in a fresh database: ``--cost-instances``
    (1,000) instances filled with ``--rows`` rows as in (1) (not timed),
    then ``--cost-events`` (20,000) events each updating one row of a
    random instance (same seed in both modes), appended in batches of
    ``--batch`` as fast as possible, with ``sql_mirror=True`` and
    ``sql_mirror=False``: events/s from the first append to every event
    processed and ``wait_idle()`` returning; with the mirror also to
    ``sql_settled()``. ``--cost-runs`` (3) runs of each (alternating which
    goes first; medians). Also this process's CPU per event (and by
    thread: the event loop, the instance databases' pool, the SQLite
    writer) and, on PostgreSQL, the scratch database's backends' CPU per
    event [target: the mirror under 10% slower].

``--trace-mirror`` times the mirror's sends by phase (wrappers on
yoke's classes installed by this script): instances per send, the reads of
changed rows (in a send, one instance after another; and at a run's end),
the store's writes.

``--profile`` runs cProfile on the event loop thread during the idle
aggregate and lookups (first backend/storage) and prints the top
functions, then the plans of both queries: on PostgreSQL EXPLAIN ANALYZE of
the text PgCatalogue.query renders, on SQLite EXPLAIN QUERY PLAN of the
view the driver makes (and its time on a fresh connection).
``--profile-cost`` runs cProfile on the event loop during each run of (5)
(the figures of such a run are not the clean ones).

``--pg-command-timeout-s``: the runtime's ``pg_command_timeout_s`` (15 s by
default). On PostgreSQL the mirror's first send after the load of (1)
carries thousands of instances in one transaction, which here took longer
than 15 s: the statement was dropped and the send retried, ever larger,
and never got through (reported). The full-size PostgreSQL figures were
taken with ``--pg-command-timeout-s 600``.

The machine's cores are shared by the database, the load and Yoke (and
whatever else runs): figures are noisy.

PostgreSQL runs in scratch databases created through ``YOKE_BENCH_PG_URL``
(default postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the
end; SQLite and instance files in a temporary directory, removed at the end.
The last line printed is a JSON list with every figure, an object per
backend and storage.

    .venv/bin/python bench/sql_catalogue.py [--backend all|sqlite|postgres]
        [--storage all|file,pg_sqlite,s3] [--instances N] [--rows N] [--rate N]
        [--max-backlog N] [--fresh N] [--cost-events N] [--cost-instances N] [--cost-runs N]
        [--skip-cost | --only-cost] [--pg-command-timeout-s S] [--trace-mirror]
        [--profile] [--profile-cost] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import cProfile
import io
import json
import logging
import os
import pstats
import random
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yoke
from actors import die_with_parent, postgres_cpu_s  # bench/actors.py (scripts run from bench/)
from append import scratch  # bench/append.py
from yoke import App, Filter

TENANT = "bench"
ACTOR = "order"
STREAM = "/orders"
STATUSES = ("new", "paid", "shipped", "cancelled")
WAIT_S = 3600.0
QUERY_TIMEOUT_S = 120.0
SETTLE_S = 900.0  # processed -> sql_settled(): past it the mirror is taken for stuck  # the bench's own: a slow query gives a figure, not a refusal

CREATE = "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT, total REAL, sku TEXT)"
FILL = (
    "INSERT INTO orders (id, status, total, sku)"
    " SELECT i, CASE i % 4 WHEN 0 THEN 'new' WHEN 1 THEN 'paid' WHEN 2 THEN 'shipped' ELSE 'cancelled' END,"
    " i * 0.5, 'sku-' || (i % 97)"
    " FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
)
TOUCH = "UPDATE orders SET sku = ? WHERE id = ?"
AGGREGATE = 'SELECT status, count(*), sum(total) FROM "order".orders GROUP BY status'
LOOKUP = 'SELECT * FROM "order".orders WHERE key = ?'
MARKER = 'SELECT sku FROM "order".orders WHERE key = ? AND id = ?'

COMBOS = (("sqlite", "file"), ("postgres", "pg_sqlite"), ("postgres", "file"), ("postgres", "s3"))


def key_of(i: int) -> str:
    return f"o{i:06d}"


def expected_aggregate(instances: int, rows: int) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for s, status in enumerate(STATUSES):
        ids = [i for i in range(1, rows + 1) if i % 4 == s]
        if ids:
            out[status] = (instances * len(ids), instances * sum(i * 0.5 for i in ids))
    return out


# --- the application -----------------------------------------------------------


@dataclass
class Probe:
    """What process() records: a count, and when marked rows were written."""

    processed: int = 0
    target: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    marks: dict[str, asyncio.Future[float]] = field(default_factory=dict)

    def expect(self, more: int) -> None:
        self.target = self.processed + more
        self.reached.clear()
        if self.processed >= self.target:
            self.reached.set()

    async def wait(self, y: yoke.Runtime) -> None:
        """Until ``target`` process() calls, then ``wait_idle()`` (whose
        count polls compete with the work: called once the work is done)."""
        await asyncio.wait_for(self.reached.wait(), WAIT_S)
        await y.wait_idle(timeout_s=WAIT_S)


def make_app(probe: Probe) -> App:
    app = App()

    @app.actor(ACTOR, filter=Filter(types=["order.fill", "order.touch"], key="payload.k"),
               concurrency=1, max_attempts=5, timeout_s=120)
    async def order(ctx, event) -> None:  # noqa: ANN001
        p = event.payload
        if event.type == "order.fill":
            await ctx.sqlite.exec(CREATE)
            await ctx.sqlite.exec(FILL, [p["rows"]])
        else:
            await ctx.sqlite.exec(TOUCH, [p["sku"], p["id"]])
        probe.processed += 1
        if probe.processed == probe.target:
            probe.reached.set()
        mark = p.get("mark")
        if mark is not None:
            waiter = probe.marks.get(mark)
            if waiter is not None and not waiter.done():
                waiter.set_result(time.perf_counter())

    return app


def fill_event(i: int, rows: int) -> dict[str, Any]:
    return {"type": "order.fill", "payload": {"k": key_of(i), "rows": rows}}


def touch_event(i: int, row: int, sku: str, **extra: Any) -> dict[str, Any]:
    return {"type": "order.touch", "payload": {"k": key_of(i), "id": row, "sku": sku, **extra}}


# --- figures -------------------------------------------------------------------


def cuts(samples: list[float]) -> tuple[float, float, float]:
    """p50, p99, max (ms)."""
    if not samples:
        return (float("nan"),) * 3  # type: ignore[return-value]
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[98], max(samples)


@dataclass
class Result:
    backend: str
    storage: str
    instances: int = 0
    rows: int = 0
    load_processed_s: float = 0.0
    load_mirrored_s: float = 0.0
    load_rows_per_s: float = 0.0
    idle_agg_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    idle_lookup_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    agg_correct: bool = False
    rate_target: float = 0.0
    rate_appended: float = 0.0
    rate_processed: float = 0.0
    backlog_end: int = 0
    capped_pct: float = 0.0  # of the load's time, the producer held back by --max-backlog
    load_agg_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_lookup_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_agg_correct: bool = False
    fresh_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    fresh_actor_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    fresh_mirror_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    fresh_samples: int = 0
    fresh_missed: int = 0
    cost_on_eps: float = 0.0
    cost_on_settled_eps: float = 0.0
    cost_off_eps: float = 0.0
    cost_slower_pct: float = 0.0
    cost_on_cpu_ms: float = 0.0  # this process, per event
    cost_off_cpu_ms: float = 0.0
    cost_on_pg_cpu_ms: float = 0.0  # the scratch database's backends, per event
    cost_off_pg_cpu_ms: float = 0.0
    cost_runs: list[dict[str, Any]] = field(default_factory=list)
    mirror_warnings: int = 0  # warnings the SQL mirror logged (closing runtimes included)
    trace: dict[str, str] = field(default_factory=dict)  # --trace-mirror: by phase
    skipped: str = ""
    profile: str = ""


def say(combo: str, what: str, figure: str) -> None:
    print(f"{combo:<20} {what:<58} {figure}", flush=True)


# --- S3 (moto's standalone server) -----------------------------------------------


class Moto:
    """moto's S3 server as a subprocess (as tests/actors/test_state_s3.py runs it)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.error = ""

    def start(self, folder: Path) -> bool:
        try:
            import boto3  # noqa: F401
            import moto  # noqa: F401
        except ImportError as exc:
            self.error = f"moto/boto3 not installed ({exc})"
            return False
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_DEFAULT_REGION", "us-east-1")):
            os.environ[name] = value
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
            os.environ.pop(name, None)
        self.log = open(folder / "moto.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                self.error = f"moto server exited with {self.proc.returncode} (log: {folder / 'moto.log'})"
                return False
            try:
                with urllib.request.urlopen(self.url + "/", timeout=1):
                    return True
            except OSError:
                if time.monotonic() > deadline:
                    self.error = "moto server did not answer in 30 s"
                    self.stop()
                    return False
                time.sleep(0.05)

    def bucket(self) -> str:
        import boto3

        name = "yoke-bench-" + uuid.uuid4().hex[:12]
        boto3.client("s3", endpoint_url=self.url).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


MOTO = Moto()


SETTINGS: dict[str, Any] = {}  # --pg-command-timeout-s


def settings_for(storage: str, folder: Path, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"data_dir": str(folder / "data"), "storage": storage, **SETTINGS, **extra}
    if storage == "s3":
        s.update(s3_bucket=MOTO.bucket(), s3_endpoint_url=MOTO.url, s3_sync="lazy")
    return s


# --- what the mirror does (--trace-mirror) and its warnings -----------------------


IN_SEND: contextvars.ContextVar[bool] = contextvars.ContextVar("in_send", default=False)


class MirrorTrace:
    """Wrappers (installed on the classes by this script; nothing in yoke/
    changes) timing the mirror's sends: SqlMirror._send (one tenant's batch),
    the reads of each instance's changed rows (InstanceDatabase.mirror_changes:
    those a send awaits, one instance after another, and any made elsewhere,
    e.g. at a run's end) and the store's write (catalogue.mirror)."""

    def __init__(self) -> None:
        self.sends: list[tuple[float, int]] = []  # (ms, instances)
        self.reads: list[float] = []  # ms, each, in a send
        self.other_reads: list[float] = []  # ms, each, outside a send
        self.writes: list[tuple[float, int, int]] = []  # (ms, instances, rows)

    def reset(self) -> None:
        self.sends.clear()
        self.reads.clear()
        self.other_reads.clear()
        self.writes.clear()

    def install(self) -> None:
        from yoke.actors.sql_mirror import SqlMirror
        from yoke.actors.state import InstanceDatabase
        from yoke.store.postgres.catalogue import PgCatalogue
        from yoke.store.sqlite.catalogue import SqliteCatalogue

        trace = self

        def wrap(cls: Any, name: str, record: Callable[[float, tuple[Any, ...]], None]) -> None:
            inner = getattr(cls, name)

            async def timed(*a: Any, **kw: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await inner(*a, **kw)
                finally:
                    record((time.perf_counter() - start) * 1000, a)

            setattr(cls, name, timed)

        inner_send = SqlMirror._send

        async def send(*a: Any, **kw: Any) -> Any:
            token = IN_SEND.set(True)
            try:
                return await inner_send(*a, **kw)
            finally:
                IN_SEND.reset(token)

        SqlMirror._send = send
        wrap(SqlMirror, "_send", lambda ms, a: trace.sends.append((ms, len(a[2]))))
        wrap(InstanceDatabase, "mirror_changes",
             lambda ms, a: (trace.reads if IN_SEND.get() else trace.other_reads).append(ms))
        for cls in (PgCatalogue, SqliteCatalogue):
            wrap(cls, "mirror", lambda ms, a: trace.writes.append(
                (ms, len(a[2]), sum(len(t.upserts) for c in a[2] for t in c.tables.values()))))

    def summary(self) -> str:
        if not self.sends:
            return "no sends"
        send_ms = [m for m, _ in self.sends]
        per = [n for _, n in self.sends]
        write_ms = [m for m, _, _ in self.writes] or [0.0]
        rows = [r for _, _, r in self.writes] or [0]
        return (f"{len(self.sends)} sends: ms p50 {statistics.median(send_ms):.0f} max {max(send_ms):.0f},"
                f" instances/send p50 {statistics.median(per):.0f} max {max(per)};"
                f" reads of changed rows in sends (one instance after another) p50 / p99 / max"
                f" {fmt3(cuts(self.reads))}, sum {sum(self.reads) / 1000:.1f} s;"
                f" {len(self.other_reads)} reads elsewhere (a run's end) p50 / p99 / max"
                f" {fmt3(cuts(self.other_reads))}; store writes p50 {statistics.median(write_ms):.0f} ms"
                f" max {max(write_ms):.0f}, sum {sum(write_ms) / 1000:.1f} s, rows/write p50"
                f" {statistics.median(rows):.0f}")


TRACE = MirrorTrace()


class Repeats(logging.Filter):
    """Lets the first of each warning of the SQL mirror through and counts
    the rest (a closing runtime can log thousands, see the report)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = record.msg if isinstance(record.msg, str) else str(record.msg)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return self.counts[kind] == 1

    def take(self) -> int:
        n = sum(self.counts.values())
        self.counts.clear()
        return n


REPEATS = Repeats()
logging.getLogger("yoke.actors.sql_mirror").addFilter(REPEATS)


def yoke_version() -> str:
    """The commit, and a digest of uncommitted changes to yoke/ (others may be
    editing it while this runs)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "yoke"], cwd=root, capture_output=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    if not diff:
        return f"{head}, clean"
    import hashlib

    return f"{head} + uncommitted changes (diff sha1 {hashlib.sha1(diff).hexdigest()[:12]})"


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by name, pools' numbers dropped
    (Linux /proc/self/task; Python's names matched by native id)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        name = "event loop" if name == "MainThread" else name.rstrip("0123456789").rstrip("_-")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_split(before: dict[str, float], after: dict[str, float], events: int) -> str:
    """ms of CPU per event by thread, largest first (threads that ended meanwhile are lost)."""
    used = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    parts = sorted(((v, k) for k, v in used.items() if v > 0), reverse=True)
    return ", ".join(f"{k} {1000 * v / events:.2f}" for v, k in parts)


# --- the phases ------------------------------------------------------------------


async def fill(y: yoke.Runtime, probe: Probe, instances: int, rows: int, batch: int) -> tuple[float, float]:
    """One fill event per instance: (seconds to processed, to mirrored)."""
    stream = y.stream(STREAM, TENANT)
    events = [fill_event(i, rows) for i in range(instances)]
    probe.expect(instances)
    start = time.perf_counter()
    for at in range(0, len(events), batch):
        await stream.append_many(events[at : at + batch])
    await probe.wait(y)
    processed = time.perf_counter()
    try:
        await asyncio.wait_for(y.sql_settled(), SETTLE_S)
    except TimeoutError:
        raise RuntimeError(f"the mirror did not settle within {SETTLE_S:g} s of the events being processed"
                           " (see the warnings above)") from None
    return processed - start, time.perf_counter() - start


def check_aggregate(rows: list[list[Any]], expected: dict[str, tuple[int, float]]) -> bool:
    got = {r[0]: (int(r[1]), float(r[2])) for r in rows}
    if set(got) != set(expected):
        return False
    return all(got[s][0] == expected[s][0] and abs(got[s][1] - expected[s][1]) < 1e-6 * max(1, expected[s][1])
               for s in expected)


async def timed_sql(y: yoke.Runtime, query: str, params: list[Any] | None = None) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await y.sql(TENANT, query, params, timeout_s=QUERY_TIMEOUT_S)
    return (time.perf_counter() - start) * 1000, result


async def query_latency(y: yoke.Runtime, instances: int, rows: int, agg_runs: int, lookups: int,
                        rng: random.Random) -> tuple[list[float], list[float], bool]:
    """(aggregate ms, lookup ms, every aggregate answer right)."""
    expected = expected_aggregate(instances, rows)
    correct = True
    agg: list[float] = []
    for run in range(1 + agg_runs):
        ms, result = await timed_sql(y, AGGREGATE)
        if not check_aggregate(result.rows, expected):
            correct = False
            print(f"  aggregate WRONG: {result.rows} (expected {expected})", flush=True)
        if run:
            agg.append(ms)
    look: list[float] = []
    for run in range(10 + lookups):
        ms, result = await timed_sql(y, LOOKUP, [key_of(rng.randrange(instances))])
        if len(result.rows) != rows:
            raise AssertionError(f"lookup returned {len(result.rows)} rows, expected {rows}")
        if run >= 10:
            look.append(ms)
    return agg, look, correct


class Producer:
    """Appends ``rate`` touch events/s (whatever is due, every 5 ms), but
    never more than ``max_backlog`` events ahead of the actors: the rate
    achieved is then what they sustain, and the queue a marker waits
    behind stays bounded."""

    def __init__(self, y: yoke.Runtime, probe: Probe, args: argparse.Namespace, seed: int) -> None:
        self.stream = y.stream(STREAM, TENANT)
        self.probe = probe
        self.instances, self.rows, self.rate = args.instances, args.rows, args.rate
        self.max_backlog = args.max_backlog
        self.rng = random.Random(seed)
        self.sent = 0
        self.others = 0  # events appended by others (freshness markers): counted in the backlog
        self.base = probe.processed  # processed before the load began
        self.capped_s = 0.0  # time spent held back by the cap
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def backlog(self) -> int:
        return self.sent + self.others - (self.probe.processed - self.base)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        tick = 0.005
        tokens = 0.0
        last = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            tokens = min(tokens + (now - last) * self.rate, max(self.rate * 0.5, 1.0))  # up to 0.5 s of debt caught up
            last = now
            room = self.max_backlog - self.backlog
            due = min(int(tokens), room)
            if room <= 0:
                self.capped_s += tick
            if due > 0:
                batch = [touch_event(self.rng.randrange(self.instances), self.rng.randint(1, self.rows),
                                     f"load-{self.sent + n}") for n in range(due)]
                await self.stream.append_many(batch)
                self.sent += due
                tokens -= due
            await asyncio.sleep(tick)

    async def finish(self) -> None:
        self.stop.set()
        if self.task is not None:
            await self.task


async def freshness(y: yoke.Runtime, probe: Probe, producer: Producer, args: argparse.Namespace,
                    rng: random.Random) -> tuple[list[float], list[float], list[float], int]:
    """(total ms, actor ms, mirror ms, samples not seen within --fresh-timeout-s).
    Stops early past --fresh-budget-s (the actors not keeping up with the
    load makes each sample wait for the backlog)."""
    stream = y.stream(STREAM, TENANT)
    loop = asyncio.get_running_loop()
    total: list[float] = []
    actor: list[float] = []
    mirror: list[float] = []
    missed = 0
    instances, rows, poll_s = args.instances, args.rows, args.poll_ms / 1000
    begin = time.perf_counter()
    for s in range(args.fresh):
        if time.perf_counter() - begin > args.fresh_budget_s:
            print(f"  freshness: stopped after {s} samples (--fresh-budget-s {args.fresh_budget_s:g})", flush=True)
            break
        if s and s % 20 == 0:
            print(f"  freshness: {s} samples, p50 so far {statistics.median(total) if total else 0:.0f} ms,"
                  f" backlog {producer.backlog:,} events", flush=True)
        i, row = rng.randrange(instances), rng.randint(1, rows)
        mark = f"mark-{s}-{uuid.uuid4().hex[:8]}"
        probe.marks[mark] = loop.create_future()
        await stream.append(touch_event(i, row, mark, mark=mark))
        producer.others += 1
        appended = time.perf_counter()
        deadline = appended + args.fresh_timeout_s
        seen = None
        while time.perf_counter() < deadline:
            result = await y.sql(TENANT, MARKER, [key_of(i), row], timeout_s=QUERY_TIMEOUT_S)
            if result.rows and result.rows[0][0] == mark:
                seen = time.perf_counter()
                break
            await asyncio.sleep(poll_s)
        waiter = probe.marks.pop(mark)
        if seen is None:
            missed += 1
            continue
        total.append((seen - appended) * 1000)
        if waiter.done():
            ran = waiter.result()
            actor.append((ran - appended) * 1000)
            mirror.append((seen - ran) * 1000)
    return total, actor, mirror, missed


async def scale_phases(backend: str, storage: str, args: argparse.Namespace, result: Result) -> None:
    """(1) to (4) in one database."""
    combo = f"{backend}/{storage}"
    rng = random.Random(7)
    probe = Probe()
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=make_app(probe), **settings_for(storage, folder)) as y:
            result.instances, result.rows = args.instances, args.rows
            TRACE.reset()
            processed_s, mirrored_s = await fill(y, probe, args.instances, args.rows, args.batch)
            traced(result, combo, "(1) load", args)
            result.load_processed_s, result.load_mirrored_s = processed_s, mirrored_s
            result.load_rows_per_s = args.instances * args.rows / mirrored_s
            say(combo, f"(1) load {args.instances:,} x {args.rows} rows: processed / mirrored",
                f"{processed_s:.1f} s / {mirrored_s:.1f} s ({result.load_rows_per_s:,.0f} rows/s)")

            prof = cProfile.Profile() if args.profile and not PROFILED else None
            if prof is not None:
                prof.enable()
            agg, look, ok = await query_latency(y, args.instances, args.rows, args.agg_runs, args.lookups, rng)
            if prof is not None:
                prof.disable()
                try:
                    plans = await explain(y, backend, url, args.instances)
                except Exception as exc:  # (yoke/'s private names moved: the profile without the plans)
                    plans = f"EXPLAIN failed: {exc!r}\n"
                result.profile = profile_text(prof) + plans
                PROFILED.append(combo)
            result.idle_agg_ms, result.idle_lookup_ms, result.agg_correct = cuts(agg), cuts(look), ok
            say(combo, "(2) idle aggregate p50 / p99 / max", fmt3(result.idle_agg_ms) + ("" if ok else " WRONG"))
            say(combo, "(2) idle lookup by key p50 / p99 / max", fmt3(result.idle_lookup_ms))

            producer = Producer(y, probe, args, seed=11)
            producer.start()
            await asyncio.sleep(args.warmup_s)
            TRACE.reset()
            sent0, done0, t0, capped0 = producer.sent, probe.processed, time.perf_counter(), producer.capped_s
            agg, look, ok = await query_latency(y, args.instances, args.rows, args.agg_runs, args.lookups, rng)
            result.load_agg_ms, result.load_lookup_ms, result.load_agg_correct = cuts(agg), cuts(look), ok
            say(combo, "(3) under load: aggregate p50 / p99 / max", fmt3(result.load_agg_ms) + ("" if ok else " WRONG"))
            say(combo, "(3) under load: lookup by key p50 / p99 / max", fmt3(result.load_lookup_ms))
            total, actor, mirror, missed = await freshness(y, probe, producer, args, rng)
            elapsed = time.perf_counter() - t0
            result.rate_target = args.rate
            result.rate_appended = (producer.sent - sent0) / elapsed
            result.rate_processed = (probe.processed - done0) / elapsed
            result.capped_pct = 100 * (producer.capped_s - capped0) / elapsed
            await producer.finish()
            result.backlog_end = producer.backlog
            result.fresh_ms, result.fresh_actor_ms, result.fresh_mirror_ms = cuts(total), cuts(actor), cuts(mirror)
            result.fresh_samples, result.fresh_missed = len(total), missed
            say(combo, f"(4) freshness p50 / p99 / max ({len(total)} samples, {missed} missed)",
                fmt3(result.fresh_ms))
            say(combo, "(4)   of which append -> process() returned", fmt3(result.fresh_actor_ms))
            say(combo, "(4)   of which process() returned -> query saw it", fmt3(result.fresh_mirror_ms))
            traced(result, combo, "(3)+(4) under load", args)
            say(combo, "(3) load: target / appended / processed events/s",
                f"{args.rate:,.0f} / {result.rate_appended:,.0f} / {result.rate_processed:,.0f}"
                f" over {elapsed:.0f} s (backlog at the end {result.backlog_end:,};"
                f" held back by --max-backlog {result.capped_pct:.0f}% of the time)")
            # Not drained: closing waits for the runs under way, not for a backlog.


PROFILED: list[str] = []


def traced(result: Result, combo: str, phase: str, args: argparse.Namespace) -> None:
    if args.trace_mirror:
        result.trace[phase] = TRACE.summary()
        say(combo, f"{phase}: the mirror's sends", result.trace[phase])
    TRACE.reset()


def fmt3(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f} ms"


def profile_text(prof: cProfile.Profile) -> str:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)
    return "cProfile of the event loop thread during the idle aggregate and lookups" \
           " (queries run on reader threads on SQLite: their time shows as waits here):\n" + out.getvalue()


async def explain(y: yoke.Runtime, backend: str, url: str, instances: int) -> str:
    """EXPLAIN ANALYZE of the two queries as the driver renders them (PostgreSQL:
    the subquery PgCatalogue.query builds; SQLite: EXPLAIN QUERY PLAN of the
    view's body)."""
    out = io.StringIO()
    if backend == "postgres":
        import asyncpg

        from yoke.store.catalogue_query import plan
        from yoke.store.postgres.catalogue import _relation

        catalogue = y.store.catalogue
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f"SET yoke.tenant = '{TENANT}'")
            tables = catalogue._cached[TENANT][1]
            for query, params in ((AGGREGATE, []), (LOOKUP, [key_of(instances // 2)])):
                checked = plan(query, "postgres")
                replace = {(s, n): f"({_relation(TENANT, s, n, tables)})" for s, n in checked.relations}
                text = checked.render(replace, "${n}")
                rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + text, *params)
                print(f"EXPLAIN ANALYZE {query}\n  rendered: {text}", file=out)
                for r in rows:
                    print("  " + r[0], file=out)
            size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('sql_rows'))")
            print(f"sql_rows total size: {size}", file=out)
        finally:
            await conn.close()
    else:
        import sqlite3

        from yoke.store.sqlite.catalogue import _relation

        path = url.removeprefix("sqlite:///")
        catalogue = y.store.catalogue
        _, tables, physical = catalogue._cached[TENANT]
        body, _ = _relation(TENANT, ACTOR, "orders", tables, physical)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for query, params in (("SELECT status, count(*), sum(total) FROM v GROUP BY status", []),
                                  ("SELECT * FROM v WHERE key = ?", [key_of(instances // 2)])):
                text = f"WITH v AS ({body}) {query}"
                print(f"EXPLAIN QUERY PLAN {text}", file=out)
                for r in conn.execute("EXPLAIN QUERY PLAN " + text, params):
                    print("  ", r, file=out)
                start = time.perf_counter()
                conn.execute(text, params).fetchall()
                print(f"  direct on a fresh connection: {1000 * (time.perf_counter() - start):.1f} ms", file=out)
        finally:
            conn.close()
    return out.getvalue()


async def cost_run(backend: str, storage: str, mirror: bool, args: argparse.Namespace) -> dict[str, float]:
    """(5) one mode in a fresh database."""
    probe = Probe()
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=make_app(probe), **settings_for(storage, folder, sql_mirror=mirror)) as y:
            await fill(y, probe, args.cost_instances, args.rows, args.batch)
            rng = random.Random(23)
            events = [touch_event(rng.randrange(args.cost_instances), rng.randint(1, args.rows), f"cost-{n}")
                      for n in range(args.cost_events)]
            stream = y.stream(STREAM, TENANT)
            database = url.rsplit("/", 1)[1] if backend == "postgres" else ""
            pg_before = postgres_cpu_s(database)[0] if database else 0.0
            cpu_before = time.process_time()
            threads_before = thread_cpu()
            probe.expect(len(events))
            prof = cProfile.Profile() if args.profile_cost else None
            if prof is not None:
                prof.enable()
            start = time.perf_counter()
            for at in range(0, len(events), args.batch):
                await stream.append_many(events[at : at + args.batch])
            TRACE.reset()
            await probe.wait(y)
            processed = time.perf_counter()
            await y.sql_settled()
            settled = time.perf_counter()
            if args.trace_mirror and mirror:
                print(f"  (5) mirror on: the mirror's sends: {TRACE.summary()}", flush=True)
            cpu = time.process_time() - cpu_before
            if prof is not None:
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
                print(f"\n=== cProfile of the event loop, (5) mirror {'on' if mirror else 'off'}"
                      f" (cProfile slows it: the figures of this run are not the clean ones) ===\n"
                      + out.getvalue(), flush=True)
            split = cpu_split(threads_before, thread_cpu(), len(events))
            pg = (postgres_cpu_s(database)[0] - pg_before) if database else 0.0
            if mirror:  # the updates reached the mirror
                check = await y.sql(TENANT, 'SELECT count(*) FROM "order".orders WHERE sku LIKE \'cost-%\'',
                                    timeout_s=QUERY_TIMEOUT_S)
                touched = len({(e["payload"]["k"], e["payload"]["id"]) for e in events})
                assert check.rows[0][0] == touched, (check.rows, touched)
    n = len(events)
    return {"mirror": float(mirror), "eps": n / (processed - start), "settled_eps": n / (settled - start),
            "cpu_ms": cpu * 1000 / n, "pg_cpu_ms": pg * 1000 / n, "threads": split}


async def cost_phase(backend: str, storage: str, args: argparse.Namespace, result: Result) -> None:
    combo = f"{backend}/{storage}"
    runs: list[dict[str, float]] = []
    for r in range(args.cost_runs):
        for mirror in ((True, False) if r % 2 == 0 else (False, True)):
            run = await cost_run(backend, storage, mirror, args)
            say(combo, f"(5) {'mirror on ' if mirror else 'mirror off'} run {r + 1}: events/s",
                f"{run['eps']:,.0f} (to settled {run['settled_eps']:,.0f}); CPU {run['cpu_ms']:.3f} ms/event"
                + (f", postgres {run['pg_cpu_ms']:.3f} ms/event" if backend == "postgres" else ""))
            say(combo, "(5)   CPU ms/event by thread", run["threads"])
            runs.append(run)
    on = [r for r in runs if r["mirror"]]
    off = [r for r in runs if not r["mirror"]]
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    result.cost_on_eps, result.cost_off_eps = med(on, "eps"), med(off, "eps")
    result.cost_on_settled_eps = med(on, "settled_eps")
    result.cost_on_cpu_ms, result.cost_off_cpu_ms = med(on, "cpu_ms"), med(off, "cpu_ms")
    result.cost_on_pg_cpu_ms, result.cost_off_pg_cpu_ms = med(on, "pg_cpu_ms"), med(off, "pg_cpu_ms")
    result.cost_slower_pct = 100 * (1 - result.cost_on_eps / result.cost_off_eps)
    result.cost_runs = runs
    say(combo, "(5) mirror on / off events/s, slower by", f"{result.cost_on_eps:,.0f} / {result.cost_off_eps:,.0f},"
        f" {result.cost_slower_pct:.1f}%")


# --- the table -------------------------------------------------------------------


def print_table(results: list[Result], args: argparse.Namespace, command: str) -> None:
    live = [r for r in results if not r.skipped]
    names = [f"{r.backend}/{r.storage}" for r in live]
    width = max([22, *(len(n) + 2 for n in names)])
    rows: list[tuple[str, str, Callable[[Result], str], Callable[[Result], bool | None]]] = [
        ("(1) load: processed s", "", lambda r: f"{r.load_processed_s:.1f}", lambda r: None),
        ("(1) load: mirrored s (sql_settled)", "", lambda r: f"{r.load_mirrored_s:.1f}", lambda r: None),
        ("(1) load: rows/s to mirrored", "", lambda r: f"{r.load_rows_per_s:,.0f}", lambda r: None),
        ("(2) idle aggregate p50 ms", "< 1000", lambda r: f"{r.idle_agg_ms[0]:.1f}", lambda r: r.idle_agg_ms[0] < 1000),
        ("(2) idle aggregate p99 ms", "< 1000", lambda r: f"{r.idle_agg_ms[1]:.1f}", lambda r: r.idle_agg_ms[1] < 1000),
        ("(2) idle aggregate answer", "right", lambda r: "right" if r.agg_correct else "WRONG", lambda r: r.agg_correct),
        ("(2) idle lookup p50 ms", "< 50", lambda r: f"{r.idle_lookup_ms[0]:.1f}", lambda r: r.idle_lookup_ms[0] < 50),
        ("(2) idle lookup p99 ms", "< 50", lambda r: f"{r.idle_lookup_ms[1]:.1f}", lambda r: r.idle_lookup_ms[1] < 50),
        ("(3) load target ev/s", "", lambda r: f"{r.rate_target:,.0f}", lambda r: None),
        ("(3) load appended ev/s", "~target", lambda r: f"{r.rate_appended:,.0f}",
         lambda r: r.rate_appended >= 0.9 * r.rate_target),
        ("(3) load processed ev/s", "~target", lambda r: f"{r.rate_processed:,.0f}",
         lambda r: r.rate_processed >= 0.9 * r.rate_target),
        ("(3) backlog at the end (events)", "", lambda r: f"{r.backlog_end:,}", lambda r: None),
        ("(3) producer held back by the cap %", "", lambda r: f"{r.capped_pct:.0f}", lambda r: None),
        ("(3) loaded aggregate p50 ms", "< 1000", lambda r: f"{r.load_agg_ms[0]:.1f}", lambda r: r.load_agg_ms[0] < 1000),
        ("(3) loaded aggregate p99 ms", "< 1000", lambda r: f"{r.load_agg_ms[1]:.1f}", lambda r: r.load_agg_ms[1] < 1000),
        ("(3) loaded aggregate answer", "right", lambda r: "right" if r.load_agg_correct else "WRONG",
         lambda r: r.load_agg_correct),
        ("(3) loaded lookup p50 ms", "< 50", lambda r: f"{r.load_lookup_ms[0]:.1f}", lambda r: r.load_lookup_ms[0] < 50),
        ("(3) loaded lookup p99 ms", "< 50", lambda r: f"{r.load_lookup_ms[1]:.1f}", lambda r: r.load_lookup_ms[1] < 50),
        ("(4) freshness p50 ms", "", lambda r: f"{r.fresh_ms[0]:.1f}", lambda r: None),
        ("(4) freshness p99 ms", "<= 1000", lambda r: f"{r.fresh_ms[1]:.1f}", lambda r: r.fresh_ms[1] <= 1000),
        ("(4) freshness max ms", "", lambda r: f"{r.fresh_ms[2]:.1f}", lambda r: None),
        ("(4)  actor part p50 / p99 ms", "", lambda r: f"{r.fresh_actor_ms[0]:.0f} / {r.fresh_actor_ms[1]:.0f}",
         lambda r: None),
        ("(4)  mirror part p50 / p99 ms", "", lambda r: f"{r.fresh_mirror_ms[0]:.0f} / {r.fresh_mirror_ms[1]:.0f}",
         lambda r: None),
        ("(4) samples seen / missed", "", lambda r: f"{r.fresh_samples} / {r.fresh_missed}", lambda r: r.fresh_missed == 0),
        ("(5) mirror on ev/s", "", lambda r: f"{r.cost_on_eps:,.0f}", lambda r: None),
        ("(5) mirror on ev/s to settled", "", lambda r: f"{r.cost_on_settled_eps:,.0f}", lambda r: None),
        ("(5) mirror off ev/s", "", lambda r: f"{r.cost_off_eps:,.0f}", lambda r: None),
        ("(5) slower with the mirror %", "< 10", lambda r: f"{r.cost_slower_pct:.1f}", lambda r: r.cost_slower_pct < 10),
        ("(5) CPU ms/event on / off (yoke)", "", lambda r: f"{r.cost_on_cpu_ms:.2f} / {r.cost_off_cpu_ms:.2f}",
         lambda r: None),
        ("(5) CPU ms/event on / off (pg)", "", lambda r: f"{r.cost_on_pg_cpu_ms:.2f} / {r.cost_off_pg_cpu_ms:.2f}",
         lambda r: None),
        ("warnings logged by the SQL mirror", "", lambda r: f"{r.mirror_warnings:,}", lambda r: None),
    ]
    if args.only_cost:
        rows = [row for row in rows if not row[0].startswith(("(1)", "(2)", "(3)", "(4)"))]
    if args.skip_cost:
        rows = [row for row in rows if not row[0].startswith("(5)")]
    print(f"\nSQL catalogue: {args.instances:,} instances x {args.rows} rows; load {args.rate:,.0f} events/s;"
          f" cost {args.cost_events:,} events over {args.cost_instances:,} instances, {args.cost_runs} run(s) per mode")
    head = f"{'figure':<36}{'target':<9}" + "".join(f"{n:>{width}}" for n in names)
    print(head)
    print("-" * len(head))
    for label, target, value, ok in rows:
        cells = ""
        for r in live:
            verdict = ok(r)
            mark = "" if verdict is None or not target else (" ok" if verdict else " !!")
            cells += f"{value(r) + mark:>{width}}"
        print(f"{label:<36}{target:<9}{cells}")
    for r in results:
        if r.skipped:
            print(f"{r.backend}/{r.storage}: skipped ({r.skipped})")
    print("(!! : target missed; the machine's 2 cores are shared by the database, the load and Yoke: figures are noisy)")
    print(f"command: {command}")
    print(f"yoke/: {yoke_version()}")


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("all", "sqlite", "postgres"), default="all")
    parser.add_argument("--storage", default="all",
                        help="comma-separated: file, pg_sqlite, s3 (default all: sqlite/file, postgres/pg_sqlite,"
                             " postgres/file, postgres/s3)")
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--agg-runs", type=int, default=10)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--rate", type=float, default=1000.0, help="background events/s in (3) and (4)")
    parser.add_argument("--max-backlog", type=int, default=250,
                        help="the producer stays at most this many events ahead of the actors")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--fresh", type=int, default=120, help="freshness samples")
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--fresh-timeout-s", type=float, default=30.0, help="a sample not seen by then is missed")
    parser.add_argument("--fresh-budget-s", type=float, default=300.0, help="freshness stops after this long")
    parser.add_argument("--cost-instances", type=int, default=1000)
    parser.add_argument("--cost-events", type=int, default=20_000)
    parser.add_argument("--cost-runs", type=int, default=3)
    parser.add_argument("--skip-cost", action="store_true", help="only (1)-(4)")
    parser.add_argument("--only-cost", action="store_true", help="only (5)")
    parser.add_argument("--pg-command-timeout-s", type=float, default=None,
                        help="the runtime's pg_command_timeout_s (default: its own, 15 s); the mirror's"
                             " first send after a large load can take longer (see the report)")
    parser.add_argument("--trace-mirror", action="store_true",
                        help="time the mirror's sends, reads and writes (wrappers; adds a little cost)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile + EXPLAIN of the idle queries (first backend/storage)")
    parser.add_argument("--profile-cost", action="store_true",
                        help="cProfile the event loop during each run of (5) (slows them: figures not clean)")
    parser.add_argument("--quick", action="store_true",
                        help="500 instances, 3 aggregates, 50 lookups, 30 freshness samples, 4,000 cost events")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.agg_runs, args.lookups, args.fresh = 500, 3, 50, 30
        args.cost_events, args.cost_instances = 4000, 200
    if args.skip_cost and args.only_cost:
        parser.error("--skip-cost and --only-cost exclude each other")
    storages = {"file", "pg_sqlite", "s3"} if args.storage == "all" else {s.strip() for s in args.storage.split(",")}
    if not storages <= {"file", "pg_sqlite", "s3"}:
        parser.error("--storage takes file, pg_sqlite and/or s3")
    combos = [(b, s) for b, s in COMBOS if args.backend in ("all", b) and s in storages]
    if not combos:
        parser.error("no backend/storage left to run (SQLite runs with file storage here)")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/sql_catalogue.py", *argv])
    if args.trace_mirror:
        TRACE.install()
    if args.pg_command_timeout_s is not None:
        SETTINGS["pg_command_timeout_s"] = args.pg_command_timeout_s
    print(f"yoke/: {yoke_version()}", flush=True)

    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        if any(s == "s3" for _, s in combos):
            import tempfile

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="yoke_bench_moto_")))
            if MOTO.start(folder):
                stack.callback(MOTO.stop)
        for backend, storage in combos:
            result = Result(backend, storage)
            results.append(result)
            if storage == "s3" and not MOTO.proc:
                result.skipped = MOTO.error
                say(f"{backend}/{storage}", "skipped", MOTO.error)
                continue
            if not args.only_cost:
                await scale_phases(backend, storage, args, result)
            if not args.skip_cost:
                await cost_phase(backend, storage, args, result)
            result.mirror_warnings = REPEATS.take()
            if result.mirror_warnings:
                say(f"{backend}/{storage}", "warnings logged by the SQL mirror (first of each shown)",
                    f"{result.mirror_warnings:,}")
    print_table(results, args, command)
    for r in results:
        if r.profile:
            print(f"\n=== profile: {r.backend}/{r.storage} ===\n{r.profile}")
    print(json.dumps([{k: v for k, v in asdict(r).items() if k != "profile"} for r in results]), flush=True)


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # asyncio.run cancels main: scratch databases are dropped on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)
    asyncio.run(main(sys.argv[1:]))
