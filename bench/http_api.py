#!/usr/bin/env python
"""HTTP benchmark: a real ``yoke serve`` process, driven over HTTP/1.1.

What it measures, per backend, against its own server (started here with
``YOKE_ACCESS_LOG=0``; the load generator is one asyncio loop in this
process on plain asyncio streams -- a client library would cost more CPU
per request than the server, on the same two cores -- with keep-alive
HTTP/1.1 connections):

(a) single-event appends: 32 concurrent clients, each POSTing one event
    after another to one stream -- events/s (and per-request p50/p99).
(b) batches: the same 32 clients POSTing batches of 100 events -- events/s.
(c) SSE fan-out: 500 concurrent tails (``/-/tail``, one connection each) on
    one stream; then 200 single events are appended 10 ms apart, open loop
    (append i is sent at i * 10 ms whether or not earlier ones have been
    answered, over 8 connections), each carrying its send time
    (``time.time_ns()``) in the payload. Latency of a receipt = arrival at a
    tail - send time of that append; p50/p99 over every (tail, event)
    receipt (100,000 of them).

Targets on the 2-core machine, PostgreSQL (client and server share the
cores): (a) >= 7,000 events/s; (b) >= 50,000 events/s; (c) p99 <= 150 ms.
``--workers N`` runs ``yoke serve --workers N`` on PostgreSQL (N processes
on one port; SQLite is one process).
SQLite figures are printed for comparison, without a verdict.

PostgreSQL runs in a scratch database created through ``YOKE_BENCH_PG_URL``
(default postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the
end; everything else (SQLite file, server data dir and log) lives in a
temporary directory, removed at the end. The server is stopped and the
scratch database dropped even when a measurement fails or the run is
interrupted. The whole run takes about a minute (at most ~2 minutes: the
fan-out stops waiting for receipts after 30 s and reports what arrived).
The last line printed is one JSON object with every figure.

    .venv/bin/python bench/http_api.py [--backend all|postgres|sqlite]
                                   [--seconds 5] [--tails 500] [--sse-events 200] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

import httpx

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CLIENTS = 32
BATCH = 100
WARMUP_S = 1.0
SSE_SPACING_S = 0.010
WRITERS = 8  # connections the fan-out appends are sent on
SSE_DRAIN_TIMEOUT_S = 30.0
TARGETS = {"single_events_per_s": 7_000, "batch_events_per_s": 50_000, "fanout_p99_ms": 150}


# --- the server ----------------------------------------------------------------------


@dataclass
class Server:
    url: str
    token: str
    process: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    db_url: str, workdir: Path, workers: int = 1, *, args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Server:
    """``yoke serve [args]`` on a free port, output to ``workdir/server.log``;
    waits until ``/readyz`` answers and the admin token file exists."""
    port = free_port()
    data_dir = workdir / ".yoke"
    log_path = workdir / "server.log"
    env = {
        **os.environ,
        "YOKE_DATABASE_URL": db_url,
        "YOKE_DATA_DIR": str(data_dir),
        "YOKE_PORT": str(port),
        "YOKE_ACCESS_LOG": "0",
        # Every tail holds a connection: the cap (default 1000) must not be
        # what a run with --tails in the thousands measures.
        "YOKE_HTTP_MAX_CONNECTIONS": os.environ.get("YOKE_HTTP_MAX_CONNECTIONS", "100000"),
        **(extra_env or {}),
    }
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", "serve", "--workers", str(workers), *args], env=env, stdout=log,
            stderr=subprocess.STDOUT, cwd=cwd or workdir,
        )
    server = Server(f"http://127.0.0.1:{port}", "", process, log_path)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=server.url, timeout=1, verify=False) as probe:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"yoke serve exited ({process.returncode}):\n{log_path.read_text()[-4000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if probe.get("/readyz").status_code == 200 and (data_dir / f"token-{port}").exists():
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("yoke serve did not become ready within 60 s")
                time.sleep(0.05)
        server.token = (data_dir / f"token-{port}").read_text().strip()
    except BaseException:
        stop_server(server)
        raise
    return server


def stop_server(server: Server) -> None:
    if server.process.poll() is not None:
        return
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + database))


async def admin_sql(admin_url: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def backend_database(backend: str, workdir: Path) -> Iterator[str]:
    """The database URL of one backend run; a PostgreSQL scratch database is
    dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir}/yoke.db"
        return
    admin_url = os.environ.get("YOKE_BENCH_PG_URL", DEFAULT_PG_URL)
    name = f"yoke_bench_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin_sql(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(admin_url, name)
    finally:
        asyncio.run(admin_sql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# --- measurements ----------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams. A full client
    library costs more CPU per request than the server does here, and the
    two share the machine's two cores; this one costs a few microseconds."""

    def __init__(self, server: Server) -> None:
        split = urlsplit(server.url)
        self.host, self.port = split.hostname or "127.0.0.1", split.port or 80
        self.auth = f"Authorization: Bearer {server.token}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def send(self, method: str, target: str, body: bytes = b"") -> None:
        assert self.writer is not None
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        ).encode()
        self.writer.write(head + self.auth + b"\r\n" + body)

    async def response_head(self) -> tuple[int, dict[bytes, bytes]]:
        assert self.reader is not None
        status = int((await self.reader.readline()).split()[1])
        headers: dict[bytes, bytes] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        assert self.reader is not None
        self.send(method, target, body)
        status, headers = await self.response_head()
        length = int(headers.get(b"content-length", b"0"))
        return status, (await self.reader.readexactly(length) if length else b"")

    async def chunks(self) -> Any:
        """The decoded chunks of a chunked response body (SSE)."""
        assert self.reader is not None
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                return
            data = await self.reader.readexactly(size + 2)
            yield data[:-2]


def stream_url(path: str, action: str) -> str:
    return f"/v1/streams{path}/-/{action}"


async def appends(server: Server, *, path: str, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` tasks POST back to back for WARMUP_S + ``seconds``; only
    requests that complete inside the measured window count."""
    if batch == 1:
        body = orjson.dumps({"type": "bench.single", "payload": {"n": 1, "note": "x" * 64}})
    else:
        body = orjson.dumps([{"type": "bench.batch", "payload": {"n": i, "note": "x" * 64}} for i in range(batch)])
    url = stream_url(path, "events")
    latencies: list[float] = []
    done = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + WARMUP_S, start + WARMUP_S + seconds

    async def worker() -> None:
        nonlocal done
        async with RawConnection(server) as connection:
            while (sent := loop.time()) < stop_at:
                status, answer = await connection.request("POST", url, body)
                if status != 201:
                    raise RuntimeError(f"append answered {status}: {answer[:300]!r}")
                finished = loop.time()
                if measure_from <= sent and finished <= stop_at:
                    done += 1
                    latencies.append(finished - sent)

    async with asyncio.TaskGroup() as group:  # one failure cancels the other workers
        for _ in range(clients):
            group.create_task(worker())
    latencies.sort()
    return {
        "events_per_s": round(done * batch / seconds),
        "requests_per_s": round(done / seconds),
        "request_p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
        "request_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "clients": clients,
        "batch": batch,
        "seconds": seconds,
    }


class Tail:
    """One SSE connection: records the latency of every event it receives."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.connected = asyncio.Event()
        self.finished = asyncio.Event()
        self.latencies_ns: list[int] = []

    async def run(self, server: Server, url: str, after: int) -> None:
        async with RawConnection(server) as connection:
            connection.send("GET", f"{url}?after={after}")
            status, _ = await connection.response_head()
            if status != 200:
                raise RuntimeError(f"tail answered {status}")
            buffer = b""
            async for chunk in connection.chunks():
                arrived = time.time_ns()
                buffer += chunk
                *blocks, buffer = buffer.split(b"\n\n")
                for block in blocks:
                    if block.startswith(b":"):
                        self.connected.set()  # ": tailing" (or a ping)
                        continue
                    data = block[block.index(b"data: ") + 6 :]
                    event = orjson.loads(data)
                    self.latencies_ns.append(arrived - event["payload"]["sent_ns"])
                if len(self.latencies_ns) >= self.expected:
                    self.finished.set()
                    return


async def fanout(server: Server, *, path: str, tails: int, events: int) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        writers = [await stack.enter_async_context(RawConnection(server)) for _ in range(WRITERS)]
        # The stream exists, so every tail starts from its head (0).
        status, answer = await writers[0].request("PUT", f"/v1/streams{path}", b"{}")
        if status not in (200, 201):
            raise RuntimeError(f"creating {path} answered {status}: {answer[:300]!r}")
        head = orjson.loads(answer)["head"]

        readers = [Tail(events) for _ in range(tails)]
        connect_started = time.perf_counter()
        tasks = [asyncio.create_task(r.run(server, stream_url(path, "tail"), head)) for r in readers]
        try:
            await wait_all([r.connected for r in readers], tasks, timeout=60, what="tails to connect")
            connect_s = time.perf_counter() - connect_started

            # Open loop: append i is sent at start + i * SSE_SPACING_S whether
            # or not earlier appends have been answered (WRITERS connections).
            loop = asyncio.get_running_loop()
            start = loop.time()
            post_latencies: list[float] = []
            idle = asyncio.Queue[RawConnection]()
            for w in writers:
                idle.put_nowait(w)

            async def append(i: int) -> None:
                # The send time is taken before waiting for a free connection.
                body = orjson.dumps({"type": "bench.fanout", "payload": {"i": i, "sent_ns": time.time_ns()}})
                sent = loop.time()
                connection = await idle.get()
                try:
                    status, answer = await connection.request("POST", stream_url(path, "events"), body)
                finally:
                    idle.put_nowait(connection)
                post_latencies.append(loop.time() - sent)
                if status != 201:
                    raise RuntimeError(f"append answered {status}: {answer[:300]!r}")

            posts = []
            for i in range(events):
                await asyncio.sleep(max(0.0, start + i * SSE_SPACING_S - loop.time()))
                posts.append(asyncio.create_task(append(i)))
            await asyncio.gather(*posts)
            append_s = loop.time() - start
            with contextlib.suppress(TimeoutError):
                await wait_all([r.finished for r in readers], tasks, timeout=SSE_DRAIN_TIMEOUT_S, what="receipts")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    latencies = sorted(ns / 1e6 for r in readers for ns in r.latencies_ns)
    post_latencies.sort()
    return {
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "max_ms": round(latencies[-1], 1) if latencies else None,
        "receipts": len(latencies),
        "expected_receipts": tails * events,
        "tails": tails,
        "events": events,
        "connect_s": round(connect_s, 2),
        "append_window_s": round(append_s, 2),
        "append_p50_ms": round(percentile(post_latencies, 0.50) * 1000, 2),
        "append_p99_ms": round(percentile(post_latencies, 0.99) * 1000, 2),
    }


async def wait_all(flags: list[asyncio.Event], tasks: list[asyncio.Task], *, timeout: float, what: str) -> None:
    """Wait until every flag is set; a failed task fails the wait at once."""
    waiting = asyncio.ensure_future(asyncio.gather(*(f.wait() for f in flags)))
    try:
        async with asyncio.timeout(timeout):
            while not waiting.done():
                failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
                if failed is not None:
                    raise failed.exception()  # type: ignore[misc]
                await asyncio.wait({waiting}, timeout=0.2)
    except TimeoutError:
        missing = sum(not f.is_set() for f in flags)
        print(f"  ! timed out after {timeout:.0f} s waiting for {what}: {missing}/{len(flags)} outstanding",
              file=sys.stderr)
        raise
    finally:
        waiting.cancel()


async def measure(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    single = await appends(server, path=f"/bench/{run}/single", batch=1, clients=CLIENTS, seconds=args.seconds)
    batch = await appends(server, path=f"/bench/{run}/batch", batch=BATCH, clients=CLIENTS, seconds=args.seconds)
    fan = await fanout(server, path=f"/bench/{run}/fanout", tails=args.tails, events=args.sse_events)
    return {"single": single, "batch": batch, "fanout": fan}


# --- reporting and main ----------------------------------------------------------


def report(backend: str, figures: dict[str, Any]) -> None:
    def verdict(ok: bool) -> str:
        return ("OK" if ok else "MISSED") if backend == "postgres" else "(target is for PostgreSQL)"

    s, b, f = figures["single"], figures["batch"], figures["fanout"]
    print(
        f"{backend:8}  (a) single appends, {s['clients']} clients: {s['events_per_s']:>7,} events/s "
        f"(request p50 {s['request_p50_ms']} ms, p99 {s['request_p99_ms']} ms)   "
        f"target >= {TARGETS['single_events_per_s']:,}  {verdict(s['events_per_s'] >= TARGETS['single_events_per_s'])}"
    )
    print(
        f"{backend:8}  (b) batches of {b['batch']}, {b['clients']} clients: {b['events_per_s']:>7,} events/s "
        f"(request p50 {b['request_p50_ms']} ms, p99 {b['request_p99_ms']} ms)   "
        f"target >= {TARGETS['batch_events_per_s']:,}  {verdict(b['events_per_s'] >= TARGETS['batch_events_per_s'])}"
    )
    complete = f["receipts"] == f["expected_receipts"]
    print(
        f"{backend:8}  (c) SSE fan-out, {f['tails']} tails x {f['events']} events: p50 {f['p50_ms']} ms, "
        f"p99 {f['p99_ms']} ms, max {f['max_ms']} ms ({f['receipts']:,}/{f['expected_receipts']:,} receipts; "
        f"tails connected in {f['connect_s']} s; appends took {f['append_window_s']} s, "
        f"append p50 {f['append_p50_ms']} ms)   target p99 <= {TARGETS['fanout_p99_ms']} ms  "
        f"{verdict(complete and f['p99_ms'] <= TARGETS['fanout_p99_ms'])}"
    )


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"yoke-bench-{backend}-") as tmp:
        workdir = Path(tmp)
        with backend_database(backend, workdir) as db_url:
            server = start_server(db_url, workdir, args.workers if backend == "postgres" else 1)
            try:
                figures = asyncio.run(measure(server, args))
            except BaseException:
                print(f"--- {backend} server log (tail) ---\n{server.log.read_text()[-3000:]}", file=sys.stderr)
                raise
            finally:
                stop_server(server)
    report(backend, figures)
    return figures


def interrupt(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C: the server is stopped, the database dropped."""
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["all", "postgres", "sqlite"], default="all")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per append benchmark")
    parser.add_argument("--workers", type=int, default=1,
                        help="yoke serve --workers N on PostgreSQL (SQLite always runs one process)")
    parser.add_argument("--tails", type=int, default=500)
    parser.add_argument("--sse-events", type=int, default=200)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, interrupt)

    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    load = os.getloadavg()[0]
    print(f"yoke HTTP benchmark: {os.cpu_count()} CPUs shared by client and server; load average {load:.2f}")
    results: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m_at_start": round(load, 2), "targets_postgres": TARGETS}
    for backend in backends:
        print(f"{backend}: measuring (a), (b), (c) ...", flush=True)
        results[backend] = run_backend(backend, args)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted (server stopped, scratch database dropped)", file=sys.stderr)
        sys.exit(130)
