#!/usr/bin/env python
"""Subscription benchmark: copy throughput, webhook throughput, delivery lag.

One process opens ``yoke.open(url, app=app)`` with the default settings
(printed first); ``app`` registers the ``lag`` receiver and no actor (so no
actor executor runs: only the delivery engine). ``--no-app`` opens without
an app for every figure but the call lag.

(1) copy throughput, events copied per second through one copy
    subscription (``copy_to_stream("/dst")``):
    - backlog: ``--copy-events`` (50,000) events preloaded into ``/src`` with
      ``append_many`` batches of ``--batch`` (1,000); the clock runs from the
      ``subscribe(..., start="beginning")`` call until
      ``wait_until_processed(name, offset of the configure event)`` returns.
    - live: a copy subscription (``start="now"``) on another stream, then
      the same number of events appended as fast as one producer can (the
      same batches); from the first append call until the cursor reaches the
      last offset.
    On PostgreSQL the figure is taken twice per run: on tables as the run
    left them (a fresh database; with autovacuum off, as on the bench
    machine, nothing ever analyzes them) and after an explicit ``ANALYZE``
    following the preload (what autovacuum would eventually do). The
    difference is the planner's choice for the idempotency-key lookup in
    ``yoke_append``; see the report.
(2) webhooks delivered per second, one event per POST: ``--webhook-events``
    (5,000) events preloaded, then ``subscribe(webhook(url), start=
    "beginning")`` until ``wait_until_processed``. The receiver is a separate
    process started by this script (this file with ``--receiver``): a bare
    asyncio HTTP/1.1 server on 127.0.0.1 (uvloop when installed) answering
    every request ``204`` on a keep-alive connection, counting POSTs; the
    count is checked afterwards.
(3) delivery lag under a steady load: ``--rate`` (1,000) single-event
    appends per second for ``--seconds`` (10), open loop (each append is
    started on its tick, in its own task, whether or not earlier ones have
    returned), through
    - call: a ``call("lag")`` subscription whose receiver
      (``@app.receiver("lag")``) records ``time.time()`` per event offset;
    - copy: a copy subscription into ``/lag-dst``, with a tail of
      ``/lag-dst`` in this process recording the arrival of each copy
      (includes the tail's own wake-up and read).
    Lag = receipt - the moment that event's ``append()`` returned; p50, p99,
    max over every event. The achieved append rate is printed too. On
    PostgreSQL the copy lag is also taken twice per run: never analyzed,
    and after an ``ANALYZE`` once the warm-up events are in (statistics of
    streams of a dozen events, that then grow).

Targets on the 2-core machine, PostgreSQL: (1) >= 10,000 events/s;
(2) >= 500 events/s; (3) p99 <= 200 ms. SQLite figures (``--backend
sqlite`` or ``all``) are printed for comparison, without a verdict.

Every figure is taken ``--runs`` (3) times, each run in a fresh database
(PostgreSQL: a scratch database created through ``YOKE_BENCH_PG_URL``,
default postgresql://postgres@127.0.0.1:5432/postgres, dropped at the end;
SQLite: a temporary directory, removed at the end); ranges (min - max) and
medians are printed at the end, then one JSON line with every figure.

``--profile copy|webhook|lag-call|lag-copy`` instead runs that figure once
on the first backend under cProfile (the event loop thread), with the
awaited wall time of each SQL statement (asyncpg ``Connection`` methods),
store method and webhook POST (wrappers installed by this script; nothing in
``yoke/`` is changed), the statements per delivery step and, for the lag
figures, the cursor's lag as the engine's progress signal reports it (this
reads the engine's runner table; bench only). ``--profile-stats`` runs
``ANALYZE`` first. Profiled figures run ~1.5-2x slower than unprofiled ones.

    .venv/bin/python bench/subscriptions.py [--backend postgres|sqlite|all] [--runs 3]
        [--figures copy,webhook,lag] [--copy-events N] [--batch N] [--webhook-events N]
        [--rate N] [--seconds S] [--lag-kinds call,copy] [--no-fresh-stats] [--no-app]
        [--profile copy|webhook|lag-call|lag-copy [--profile-stats]] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

import yoke
from actors import Timings, time_asyncpg, time_methods  # bench/actors.py (scripts run from bench/)
from append import DEFAULT_PG_URL, scratch  # bench/append.py
from yoke import App
from yoke.subscriptions import runner  # its constants, printed with the settings

TARGETS = {"copy_eps": 10_000, "webhook_eps": 500, "lag_p99_ms": 200}
WAIT_S = 1800.0  # wait_until_processed's timeout: the figure is reported, however slow


# --- the events -------------------------------------------------------------------


def new_event(i: int, **extra: Any) -> dict[str, Any]:
    """bench/append.py's event (~100-byte payload)."""
    return {
        "type": "order.placed",
        "payload": {"order_id": i, "sku": "ABC-123", "qty": 2, "note": "x" * 64, **extra},
    }


def batches(count: int, size: int) -> list[list[dict[str, Any]]]:
    events = [new_event(i) for i in range(count)]
    return [events[i : i + size] for i in range(0, count, size)]


def say(backend: str, label: str, value: str) -> None:
    print(f"{backend:<8} {label:<64} {value}", flush=True)


def load() -> str:
    """The 1-minute load average: on 2 cores, anything much above the
    benchmark's own ~1.5-2 means another process competed for the CPU."""
    return f"load {os.getloadavg()[0]:.2f}"


# --- scratch databases --------------------------------------------------------------


async def analyze(url: str) -> None:
    """ANALYZE the scratch database (as its superuser, like the admin URL)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def pg_server_line(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT version(), current_setting('synchronous_commit'), current_setting('autovacuum')"
        )
    finally:
        await conn.close()
    return f"{row[0].split(' on ')[0]}, synchronous_commit={row[1]}, autovacuum={row[2]}"


# --- the application ---------------------------------------------------------------


@dataclass
class Receipts:
    """What the ``lag`` receiver records: time.time() of receipt per offset."""

    at: dict[int, float] = field(default_factory=dict)
    batches: int = 0


def make_app(receipts: Receipts) -> App:
    app = App()

    @app.receiver("lag")
    async def lag(batch: dict[str, Any]) -> None:
        now = time.time()
        receipts.batches += 1
        for event in batch["events"]:
            receipts.at.setdefault(event["offset"], now)

    return app


def open_runtime(url: str, folder: Path, app: App | None) -> Any:
    """``yoke.open(url, app=app)`` with the default settings (the data_dir in
    the scratch folder). Without an app the runtime still runs the delivery
    engine (copies and webhooks need none), but no actor executor."""
    return yoke.open(url, app=app, data_dir=str(folder))


def bench_app(no_app: bool) -> App | None:
    return None if no_app else make_app(Receipts())


def settings_line(y: yoke.Runtime) -> str:
    s = y.settings
    return (
        f"subscription_sweep_s={s.subscription_sweep_s}, lease_s={s.subscription_lease_s},"
        f" timeout_s={s.subscription_timeout_s}, max_group_events={s.max_group_events};"
        f" engine: READ_PAGE={getattr(runner, 'READ_PAGE', '?')},"
        f" batch={getattr(runner, 'MAX_BATCH_EVENTS', '?')} events (copy/call),"
        f" STEP_BUDGET_S={getattr(runner, 'STEP_BUDGET_S', '?')}"
    )


# --- (1) copy throughput -------------------------------------------------------------


@dataclass
class CopyResult:
    backlog_eps: float
    backlog_s: float
    live_eps: float
    live_s: float
    live_append_s: float


async def copy_backlog(y: yoke.Runtime, url: str, count: int, size: int, stats: bool) -> tuple[float, float]:
    src = y.stream("/src")
    for chunk in batches(count, size):
        await src.append_many(chunk)
    if stats:
        await analyze(url)
    start = time.perf_counter()
    subscribed = await src.subscribe("copy", yoke.copy_to_stream("/dst"), start="beginning")
    await src.wait_until_processed("copy", subscribed.offset, timeout_s=WAIT_S)
    elapsed = time.perf_counter() - start
    info = await y.stream("/dst").info()
    # The configure event itself is copied too (it is not an audit line).
    assert info is not None and info.head >= count, (info, count)
    return count / elapsed, elapsed


async def copy_live(y: yoke.Runtime, count: int, size: int) -> tuple[float, float, float]:
    src = y.stream("/live-src")
    await src.append(new_event(-1))  # the stream exists before the subscription
    await src.subscribe("copy", yoke.copy_to_stream("/live-dst"), start="now")
    work = batches(count, size)
    start = time.perf_counter()
    last = 0
    for chunk in work:
        last = (await src.append_many(chunk))[-1].offset
    appended = time.perf_counter()
    await src.wait_until_processed("copy", last, timeout_s=WAIT_S)
    elapsed = time.perf_counter() - start
    return count / elapsed, elapsed, appended - start


async def copy_figure(backend: str, count: int, size: int, stats: bool, no_app: bool) -> CopyResult:
    async with scratch(backend) as (url, folder):
        async with open_runtime(url, folder, bench_app(no_app)) as y:
            backlog_eps, backlog_s = await copy_backlog(y, url, count, size, stats)
            live_eps, live_s, live_append_s = await copy_live(y, count, size)
    return CopyResult(backlog_eps, backlog_s, live_eps, live_s, live_append_s)


# --- (2) webhooks --------------------------------------------------------------------


class Receiver:
    """The webhook receiver process (this file with ``--receiver``)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--receiver"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = self._readline()
            self.port = int(line.split()[1])  # "listening <port> <loop>"
            self.loop_name = line.split()[2]
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def _readline(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "" if the process died
        if not line.startswith("listening"):
            raise RuntimeError(f"the webhook receiver did not start: {line!r}")
        return line

    async def count(self) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"GET /count HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            raw = await reader.read()
        finally:
            writer.close()
        return int(raw.split(b"\r\n\r\n", 1)[1])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def receiver_main() -> None:
    """A bare HTTP/1.1 server: every request is answered 204 (keep-alive);
    ``GET /count`` answers the number of POSTs so far."""
    loop_name = "asyncio"
    try:
        import uvloop

        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        pass
    posts = 0

    class Http(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            nonlocal posts
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].decode("latin-1")
                length = 0
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                if head.startswith("GET /count"):
                    body = str(posts).encode()
                    self.transport.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
                    )
                    self.transport.close()
                    return
                posts += head.startswith("POST")
                self.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Http, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(f"listening {port} {loop_name}", flush=True)
        await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


@dataclass
class WebhookResult:
    eps: float
    seconds: float
    posts: int


async def webhook_figure(
    backend: str, count: int, size: int, receiver: Receiver, no_app: bool
) -> WebhookResult:
    async with scratch(backend) as (url, folder):
        async with open_runtime(url, folder, bench_app(no_app)) as y:
            src = y.stream("/hooks")
            for chunk in batches(count, size):
                await src.append_many(chunk)
            before = await receiver.count()
            start = time.perf_counter()
            subscribed = await src.subscribe("hook", yoke.webhook(receiver.url), start="beginning")
            await src.wait_until_processed("hook", subscribed.offset, timeout_s=WAIT_S)
            elapsed = time.perf_counter() - start
            posts = await receiver.count() - before
    # Each event (and the configure event) was POSTed at least once.
    assert posts >= count, (posts, count)
    return WebhookResult(count / elapsed, elapsed, posts)


# --- (3) lag under a steady load ---------------------------------------------------------


@dataclass
class LagResult:
    kind: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    events: int
    append_rate: float  # appends returned per second over the load
    append_p50_ms: float
    append_p99_ms: float


async def paced_appends(stream: Any, rate: int, seconds: float) -> tuple[dict[int, float], list[float], float]:
    """Open loop: append i starts at start + i / rate, each in its own task.
    Returns (time.time() when each offset's append returned, append latencies
    in ms, appends returned per second)."""
    returned: dict[int, float] = {}
    latencies: list[float] = []
    total = int(rate * seconds)
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        began = time.perf_counter()
        result = await stream.append(new_event(i))
        returned[result.offset] = time.time()
        latencies.append((time.perf_counter() - began) * 1000)

    start = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            task = asyncio.create_task(one(sent))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    return returned, latencies, total / (time.perf_counter() - start)


def lag_result(kind: str, returned: dict[int, float], receipts: dict[int, float],
               latencies: list[float], rate: float) -> LagResult:  # fmt: skip
    missing = [o for o in returned if o not in receipts]
    assert not missing, f"{len(missing)} events never arrived (first {missing[:5]})"
    lags = [(receipts[o] - t) * 1000 for o, t in returned.items()]
    cuts = statistics.quantiles(lags, n=100, method="inclusive")
    app_cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return LagResult(kind, cuts[49], cuts[98], max(lags), len(lags), rate, app_cuts[49], app_cuts[98])


async def lag_call(y: yoke.Runtime, receipts: Receipts, rate: int, seconds: float, url: str | None) -> LagResult:
    src = y.stream("/lag")
    await src.append(new_event(-1))
    subscribed = await src.subscribe("lag", yoke.call("lag"), start="now")
    warm = (await src.append_many([new_event(-2) for _ in range(10)]))[-1].offset
    await src.wait_until_processed("lag", warm, timeout_s=60)
    if url is not None:
        await analyze(url)
    returned, latencies, achieved = await paced_appends(src, rate, seconds)
    await src.wait_until_processed("lag", max(returned), timeout_s=WAIT_S)
    assert subscribed.created
    return lag_result("call", returned, receipts.at, latencies, achieved)


async def lag_copy(y: yoke.Runtime, rate: int, seconds: float, url: str | None) -> LagResult:
    src, dst = y.stream("/lag-src"), y.stream("/lag-dst")
    await src.append(new_event(-1))
    await src.subscribe("copy", yoke.copy_to_stream("/lag-dst"), start="now")
    warm = (await src.append_many([new_event(-2) for _ in range(10)]))[-1].offset
    await src.wait_until_processed("copy", warm, timeout_s=60)
    if url is not None:
        await analyze(url)  # statistics of streams holding a dozen events each
    arrived: dict[int, float] = {}

    async def follow() -> None:
        async for event in dst.tail(0):
            hops = (event.source or {}).get("copied_from") or []
            if hops:
                arrived.setdefault(hops[-1]["offset"], time.time())

    follower = asyncio.create_task(follow())
    try:
        await asyncio.sleep(0.2)  # the tail has read the warm-up copies and is waiting
        returned, latencies, achieved = await paced_appends(src, rate, seconds)
        await src.wait_until_processed("copy", max(returned), timeout_s=WAIT_S)
        deadline = time.monotonic() + 30
        while any(o not in arrived for o in returned) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    return lag_result("copy", returned, arrived, latencies, achieved)


async def lag_figure(
    backend: str, kind: str, rate: int, seconds: float, stats: bool, no_app: bool
) -> LagResult:
    receipts = Receipts()
    app = None if no_app and kind == "copy" else make_app(receipts)  # call needs the app
    async with scratch(backend) as (url, folder):
        async with open_runtime(url, folder, app) as y:
            if kind == "call":
                return await lag_call(y, receipts, rate, seconds, url if stats else None)
            return await lag_copy(y, rate, seconds, url if stats else None)


# --- profiling ---------------------------------------------------------------------------


async def watch_cursor(stream: Any, name: str, processed: dict[int, float]) -> None:
    """time.time() at which the subscription's cursor was first seen at each
    value (woken by the engine's progress signal, as wait_until_processed is)."""
    deliveries = stream.runtime.deliveries
    progress = deliveries.watch()
    last = -1
    try:
        while True:
            await progress.wait()
            progress.clear()
            for runner, _ in list(deliveries._runners.values()):
                if runner.row.path == stream.path and runner.row.name == name and runner.row.cursor > last:
                    last = runner.row.cursor
                    processed[last] = time.time()
    finally:
        deliveries.unwatch(progress)


def fill_cursor(processed: dict[int, float], returned: dict[int, float]) -> dict[int, float]:
    """Per offset: when the cursor first reached or passed it."""
    marks = sorted(processed.items())
    out: dict[int, float] = {}
    i = 0
    for offset in sorted(returned):
        while i < len(marks) and marks[i][0] < offset:
            i += 1
        if i < len(marks):
            out[offset] = marks[i][1]
    return out

SUBSCRIPTION_STORE_METHODS = ["append_copies", "ack", "claim", "get", "fail", "control"]


@contextlib.contextmanager
def count_posts(timings: Timings) -> Iterator[None]:
    """Wall time of the webhook POSTs (httpx.AsyncClient.post)."""
    import httpx

    original = httpx.AsyncClient.post

    async def timed(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        start = time.perf_counter()
        try:
            return await original(self, *args, **kwargs)
        finally:
            timings.add("httpx.AsyncClient.post", time.perf_counter() - start)

    httpx.AsyncClient.post = timed
    try:
        yield
    finally:
        httpx.AsyncClient.post = original


async def profile(backend: str, figure: str, args: argparse.Namespace) -> str:
    """One run of ``figure`` with cProfile, SQL, store-method and POST timings."""
    out = io.StringIO()
    sql, methods = Timings(), Timings()
    profiler = cProfile.Profile()
    receipts = Receipts()
    receiver = Receiver() if figure == "webhook" else None
    name, path = {
        "copy": ("copy", "/src"), "webhook": ("hook", "/hooks"), "lag-call": ("lag", "/lag"),
        "lag-copy": ("copy", "/lag-src"),
    }[figure]  # fmt: skip
    lagging = figure.startswith("lag")
    try:
        async with scratch(backend) as (url, folder):
            app = None if args.no_app and figure != "lag-call" else make_app(receipts)
            async with open_runtime(url, folder, app) as y:
                store = y.store
                stream = y.stream(path)
                if not lagging:
                    count = args.copy_events if figure == "copy" else args.webhook_events
                    for chunk in batches(count, args.batch):
                        await stream.append_many(chunk)
                else:
                    count = int(args.rate * args.seconds)
                    await stream.append(new_event(-1))
                    receiver_of = yoke.call("lag") if figure == "lag-call" else yoke.copy_to_stream("/lag-dst")
                    await stream.subscribe(name, receiver_of, start="now")
                    warm = (await stream.append_many([new_event(-2) for _ in range(10)]))[-1].offset
                    await stream.wait_until_processed(name, warm, timeout_s=60)
                if args.profile_stats and backend == "postgres":
                    await analyze(url)
                time_methods(store.subscriptions, SUBSCRIPTION_STORE_METHODS, methods, "subscriptions")
                time_methods(store, ["read", "info"], methods, "store")
                with time_asyncpg(sql), count_posts(methods):
                    start = time.perf_counter()
                    profiler.enable()
                    if figure == "copy":
                        s = await stream.subscribe(name, yoke.copy_to_stream("/dst"), start="beginning")
                        await stream.wait_until_processed(name, s.offset, timeout_s=WAIT_S)
                    elif figure == "webhook":
                        assert receiver is not None
                        s = await stream.subscribe(name, yoke.webhook(receiver.url), start="beginning")
                        await stream.wait_until_processed(name, s.offset, timeout_s=WAIT_S)
                    else:
                        processed: dict[int, float] = {}
                        watcher = asyncio.create_task(watch_cursor(stream, name, processed))
                        returned, latencies, achieved = await paced_appends(stream, args.rate, args.seconds)
                        await stream.wait_until_processed(name, max(returned), timeout_s=WAIT_S)
                        watcher.cancel()
                    profiler.disable()
                    wall = time.perf_counter() - start
    finally:
        if receiver is not None:
            receiver.close()
    acks = methods.calls.get("subscriptions.ack", [0])[0]
    statements = sum(n for label, (n, _, _) in sql.calls.items())
    print(f"\n=== profile: {backend}, {figure}, {count} events: {wall:.2f}s, {count / wall:,.0f} events/s ===",
          file=out)
    if lagging:
        # The cursor's progress, as the engine reports it (time of the ack that covered each offset).
        r = lag_result(figure, returned, fill_cursor(processed, returned), latencies, achieved)
        print(f"cursor lag (append returned -> ack covering it): p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms,"
              f" max {r.max_ms:.1f} ms", file=out)
        if figure == "lag-call":
            r = lag_result(figure, returned, receipts.at, latencies, achieved)
            print(f"receipt lag: p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms;"
                  f" {receipts.batches} receiver calls", file=out)
    print(f"delivery steps acknowledged: {acks}; events per step {count / max(acks, 1):.1f};"
          f" SQL statements (all, incl. appends and wait_until_processed polls): {statements},"
          f" {statements / max(acks, 1):.1f} per step", file=out)
    print(methods.table("store methods and POSTs", wall), file=out)
    if sql.calls:
        print(sql.table("SQL statements (asyncpg Connection methods)", wall, top=30), file=out)
    for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(key).print_stats(30)
        body = text.getvalue()
        print(f"python functions by {title} (cProfile; the event loop thread only):\n"
              f"{body[body.find('   ncalls'):]}", file=out)
    return out.getvalue()


# --- main -------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi, mid = min(values), max(values), statistics.median(values)
    return f"{format(lo, fmt)} - {format(hi, fmt)} (median {format(mid, fmt)}, n={len(values)})"


async def run_backend(backend: str, args: argparse.Namespace, receiver: Receiver | None) -> dict[str, Any]:
    figures = set(args.figures)
    out: dict[str, Any] = {}
    # PostgreSQL: tables never analyzed (a fresh database; autovacuum is off on the bench
    # machine), then after an explicit ANALYZE. SQLite: one variant ("stats" unused).
    variants = [True] if backend == "sqlite" or args.no_fresh_stats else [False, True]
    if backend == "postgres":
        admin_url = os.environ.get("YOKE_BENCH_PG_URL", DEFAULT_PG_URL)
        say(backend, "server", await pg_server_line(admin_url))
    async with scratch(backend) as (url, folder):
        async with open_runtime(url, folder, bench_app(args.no_app)) as y:
            say(backend, "settings (yoke.open defaults)", settings_line(y))
    say(backend, "application", "none: delivery engine only (--no-app)" if args.no_app else
        "App() with @app.receiver('lag') and no actors (so no actor executor runs)")

    if "copy" in figures:
        for stats in variants:
            tag = "analyzed" if stats else "fresh"
            if backend == "sqlite":
                tag = "sqlite"
            results: list[CopyResult] = []
            for run in range(args.runs):
                r = await copy_figure(backend, args.copy_events, args.batch, stats and backend == "postgres",
                                      args.no_app)
                results.append(r)
                what = "" if backend == "sqlite" else f" [{'after ANALYZE' if stats else 'never analyzed'}]"
                say(backend, f"(1) copy run {run + 1}{what}: backlog / live",
                    f"{r.backlog_eps:,.0f} ev/s ({r.backlog_s:.2f}s) / {r.live_eps:,.0f} ev/s"
                    f" ({r.live_s:.2f}s; appends alone {r.live_append_s:.2f}s); {load()}")
            out[f"copy_{tag}"] = [r.__dict__ for r in results]
    if "webhook" in figures:
        assert receiver is not None
        results_w: list[WebhookResult] = []
        for run in range(args.runs):
            r = await webhook_figure(backend, args.webhook_events, args.batch, receiver, args.no_app)
            results_w.append(r)
            say(backend, f"(2) webhook run {run + 1}: {args.webhook_events} events, 1 per POST",
                f"{r.eps:,.0f} ev/s ({r.seconds:.2f}s, {r.posts} POSTs received); {load()}")
        out["webhook"] = [r.__dict__ for r in results_w]
    if "lag" in figures:
        for kind, stats in lag_variants(backend, args):
            tag = kind if backend == "sqlite" or kind == "call" else f"{kind}_{'analyzed' if stats else 'fresh'}"
            what = kind if tag == kind else f"{kind} [{'after ANALYZE' if stats else 'never analyzed'}]"
            results_l: list[LagResult] = []
            for run in range(args.runs):
                r = await lag_figure(backend, kind, args.rate, args.seconds, stats, args.no_app)
                results_l.append(r)
                say(backend, f"(3) lag run {run + 1}, {what}: p50 / p99 / max",
                    f"{r.p50_ms:.1f} / {r.p99_ms:.1f} / {r.max_ms:.1f} ms ({r.events} events,"
                    f" {r.append_rate:,.0f} appends/s achieved, append p50/p99"
                    f" {r.append_p50_ms:.1f}/{r.append_p99_ms:.1f} ms); {load()}")
            out[f"lag_{tag}"] = [r.__dict__ for r in results_l]
    return out


def lag_variants(backend: str, args: argparse.Namespace) -> list[tuple[str, bool]]:
    """(kind, ANALYZE after the warm-up?) pairs: a copy's idempotency-key
    lookup depends on the statistics on PostgreSQL; a call has no keys."""
    out = []
    for kind in args.lag_kinds:
        if backend == "postgres" and kind == "copy":
            out += [(kind, True)] if args.no_fresh_stats else [(kind, False), (kind, True)]
        else:
            out.append((kind, False))
    return out


def summary(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nsummary over {args.runs} run(s) each: min - max (median)")
    for backend, figs in results.items():
        for key, runs in figs.items():
            if key.startswith("copy"):
                variant = key.split("_", 1)[1]
                label = f"(1) copy {args.copy_events:,} events" + ("" if variant == "sqlite" else f", {variant}")
                say(backend, label + ", backlog", spread([r["backlog_eps"] for r in runs], ",.0f") + " ev/s")
                say(backend, label + ", live", spread([r["live_eps"] for r in runs], ",.0f") + " ev/s")
            elif key == "webhook":
                say(backend, f"(2) webhooks, {args.webhook_events:,} events, 1 per POST",
                    spread([r["eps"] for r in runs], ",.0f") + " ev/s")
            else:
                kind = key.split("_", 1)[1].replace("_", ", ")
                label = f"(3) lag at {args.rate}/s for {args.seconds:g}s, {kind}"
                say(backend, label + ", p50", spread([r["p50_ms"] for r in runs], ".1f") + " ms")
                say(backend, label + ", p99", spread([r["p99_ms"] for r in runs], ".1f") + " ms")
    pg = results.get("postgres")
    if not pg:
        return
    checks: list[tuple[str, list[float], bool]] = []
    for variant in ("fresh", "analyzed"):
        if f"copy_{variant}" in pg:
            worst = min(min(r["backlog_eps"], r["live_eps"]) for r in pg[f"copy_{variant}"])
            checks.append((f"(1) copy >= 10,000 ev/s ({variant}, worst run)", [worst], worst >= TARGETS["copy_eps"]))
    if "webhook" in pg:
        worst = min(r["eps"] for r in pg["webhook"])
        checks.append(("(2) webhooks >= 500 ev/s (worst run)", [worst], worst >= TARGETS["webhook_eps"]))
    for key in ("lag_call", "lag_copy_fresh", "lag_copy_analyzed"):
        if key in pg:
            worst = max(r["p99_ms"] for r in pg[key])
            kind = key.split("_", 1)[1].replace("_", ", ")
            checks.append((f"(3) lag p99 <= 200 ms ({kind}, worst run)", [worst], worst <= TARGETS["lag_p99_ms"]))
    for label, (value,), ok in checks:
        say("postgres", f"target {label}", f"{'met' if ok else 'MISSED'} ({value:,.1f})")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite", "all"), default="postgres")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--figures", default="copy,webhook,lag", help="comma-separated: copy, webhook, lag")
    parser.add_argument("--copy-events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000, help="append_many batch size for preloads")
    parser.add_argument("--webhook-events", type=int, default=5000)
    parser.add_argument("--rate", type=int, default=1000, help="appends per second for (3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of the load for (3)")
    parser.add_argument("--lag-kinds", default="call,copy", help="comma-separated: call, copy")
    parser.add_argument("--no-fresh-stats", action="store_true",
                        help="PostgreSQL copies: only the ANALYZEd variant (skip the never-analyzed one)")
    parser.add_argument("--no-app", action="store_true",
                        help="open without an app (no actor executor) except for the call lag, which needs it")
    parser.add_argument("--profile", choices=("copy", "webhook", "lag-call", "lag-copy"),
                        help="profile one run of this figure on the first backend (instead of the figures)")
    parser.add_argument("--profile-stats", action="store_true",
                        help="with --profile on PostgreSQL: ANALYZE before the profiled part")
    parser.add_argument("--quick", action="store_true", help="1 run, 5,000 copies, 1,000 webhooks, 3 s of load")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.receiver:
        receiver_main()
        return
    if args.quick:
        args.runs, args.copy_events, args.webhook_events, args.seconds = 1, 5000, 1000, 3.0
    args.figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    args.lag_kinds = [k.strip() for k in args.lag_kinds.split(",") if k.strip()]
    if not set(args.figures) <= {"copy", "webhook", "lag"}:
        parser.error("--figures takes copy, webhook and/or lag")
    if not set(args.lag_kinds) <= {"call", "copy"}:
        parser.error("--lag-kinds takes call and/or copy")
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]

    if args.profile:
        print(await profile(backends[0], args.profile, args), flush=True)
        return
    receiver = Receiver() if "webhook" in args.figures else None
    results: dict[str, dict[str, Any]] = {}
    try:
        print(f"{os.cpu_count()} CPUs; {load()} at start", flush=True)
        if receiver is not None:
            print(f"webhook receiver: {receiver.url} (pid {receiver.process.pid}, {receiver.loop_name})",
                  flush=True)
        for backend in backends:
            results[backend] = await run_backend(backend, args, receiver)
    finally:
        if receiver is not None:
            receiver.close()
    summary(results, args)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    if "--receiver" in sys.argv[1:]:
        receiver_main()
    else:
        asyncio.run(main(sys.argv[1:]))
