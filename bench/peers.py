#!/usr/bin/env python
"""Yoke against its peers, in one run, with one load generator.

The scenario (issue: performance against the peers): ``--events`` (20,000)
inputs over ``--keys`` (100) keys, sent over HTTP by ``--connections`` (32)
keep-alive connections, one input per request; each input makes its key's
handler add to a counter in that key's durable state (one handler run at a
time per key). The systems, each started here in a fresh state and stopped
after:

- ``restate``: Restate's server (the npm package ``@restatedev/restate-server``,
  pinned in bench/peers/package-lock.json) with the ``restate-sdk`` Python SDK
  on hypercorn (bench/peers/requirements.txt), a Virtual Object whose
  exclusive handler updates its K/V state (bench/peers/restate_counter.py),
  each input sent with the ingress one-way send
  (``POST /Counter/{key}/add/send``). Durability as the server ships (no
  ``--production`` profile needed for one node).
- ``yoke-sqlite`` and ``yoke-postgres``: ``yoke serve`` with a keyed actor of
  concurrency 1 doing ``ctx.state.update`` (bench/peers/yoke_counter.py),
  each input appended with ``POST /v1/streams/counters/-/events``. Durability
  as Yoke ships (SQLite in WAL mode with synchronous=FULL; PostgreSQL with
  synchronous_commit on).

Scenarios (``--scenarios``): ``state`` (the above), ``effect`` (the handler
also records one effect per input: Yoke appends an event with ``ctx.append``,
Restate journals a ``ctx.run`` step) and ``keys`` (``state`` with 10,000 keys).

Figures, per system and scenario:

- events/s end to end: from the first send until the last handler run is
  done (each handler's last statement sends a UDP datagram with its input's
  sequence number: bench/peers/probe.py); then every key's state is read back
  over HTTP and must hold every input (the run fails otherwise);
- ingress acknowledgement p50 / p99 over every request of that phase;
- send -> handler done p50 / p99 on an idle system: ``--samples`` (200)
  inputs sent one after another, each after the previous one's handler was
  done (latency = the datagram's wall time - the send's);
- CPU: seconds of each system process during the throughput phase (Restate's
  server and its SDK's hypercorn; ``yoke serve``; PostgreSQL's backends of
  the scratch database) per 1,000 events, and the cores they kept busy; the
  load generator's own CPU apart.

``--runs`` (1) repeats each (system, scenario) in a fresh state; figures are
printed per run and, with several runs, as median and range. The last line
is one JSON object with every figure.

Setup: ``make peers`` (npm install of the pinned server; pip install of the
SDK and hypercorn into .venv). PostgreSQL through ``YOKE_BENCH_PG_URL``
(default postgresql://postgres@127.0.0.1:5432/postgres).

    .venv/bin/python bench/peers.py [--systems restate,yoke-sqlite,yoke-postgres]
        [--scenarios state,effect,keys] [--events 20000] [--keys 100] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from actors import Profiler, cpu_s, database_of, postgres_cpu_s
from http_api import (
    RawConnection, Server, backend_database, free_port, interrupt, percentile, start_server, stop_server,
)

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
RESTATE_BIN = PEERS / "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
SYSTEMS = ("restate", "yoke-sqlite", "yoke-postgres")
SCENARIOS = ("state", "effect", "keys")
MANY_KEYS = 10_000
START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 600.0  # the slowest system at its slowest still finishes well inside this
STALL_S = 30.0  # no run done for this long: something is stuck (or a datagram was lost)


# --- the systems under test -------------------------------------------------------


@dataclass
class System:
    """One running system: where to send, how to read a key's state back, and
    the processes whose CPU is its cost."""

    name: str
    server: Server  # ingress URL and token (RawConnection's needs)
    send: Callable[[str, dict[str, Any]], tuple[str, bytes]]  # (key, input) -> (target, body)
    sent_status: int
    read_counts: Callable[[list[str]], Any]  # async: keys -> {key: count}
    pids: list[int]
    database: str | None = None  # PostgreSQL: the scratch database (its backends' CPU counts)

    def cpu_s(self) -> float:
        total = sum(cpu_s(pid) for pid in self.pids)
        if self.database is not None:
            total += postgres_cpu_s(self.database)[0]
        return total


def wait_until(ready: Callable[[], bool], what: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def answers(url: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(url, timeout=1).status_code < 500
    return False


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def restate(workdir: Path, env: dict[str, str]) -> Iterator[System]:
    if not RESTATE_BIN.exists():
        raise SystemExit("Restate's server is not installed: run `make peers` first")
    ingress, admin, node, sdk = free_port(), free_port(), free_port(), free_port()
    processes: list[subprocess.Popen] = []
    try:
        server_log = workdir / "restate.log"
        with server_log.open("w") as log:
            processes.append(subprocess.Popen(
                [str(RESTATE_BIN), "--no-logo", "--listen-mode", "tcp", "--base-dir", str(workdir / "restate-data")],
                env={**os.environ, **env,
                     "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress}",
                     "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin}",
                     "RESTATE_BIND_ADDRESS": f"127.0.0.1:{node}",
                     "RESTATE_LOG_FILTER": "warn"},
                stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            ))
        sdk_log = workdir / "sdk.log"
        with sdk_log.open("w") as log:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "hypercorn", "restate_counter:app", "--bind", f"127.0.0.1:{sdk}"],
                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=PEERS,
            ))
        wait_until(lambda: answers(f"http://127.0.0.1:{admin}/health"), "restate-server", processes[0], server_log)
        wait_until(lambda: answers(f"http://127.0.0.1:{sdk}/discover"), "the SDK's hypercorn", processes[1], sdk_log)
        registered = httpx.post(f"http://127.0.0.1:{admin}/deployments", json={"uri": f"http://127.0.0.1:{sdk}"},
                                timeout=30)
        registered.raise_for_status()
        ingress_url = f"http://127.0.0.1:{ingress}"
        wait_until(lambda: answers(f"{ingress_url}/restate/health"), "Restate's ingress", processes[0], server_log)

        async def read_counts(keys: list[str]) -> dict[str, int]:
            counts: dict[str, int] = {}
            async with httpx.AsyncClient(base_url=ingress_url, timeout=30) as client:
                for chunk in range(0, len(keys), 64):
                    part = keys[chunk : chunk + 64]
                    replies = await asyncio.gather(*(client.post(f"/Counter/{k}/get", json=None) for k in part))
                    for k, reply in zip(part, replies, strict=True):
                        reply.raise_for_status()
                        counts[k] = reply.json()["count"]
            return counts

        def send(key: str, item: dict[str, Any]) -> tuple[str, bytes]:
            return f"/Counter/{key}/add/send", orjson.dumps(item)

        yield System("restate", Server(ingress_url, "", processes[0], server_log), send, 202, read_counts,
                     [p.pid for p in processes])
    finally:
        for process in reversed(processes):
            stop(process)


@contextlib.contextmanager
def yoke(backend: str, workdir: Path, env: dict[str, str]) -> Iterator[System]:
    with backend_database(backend, workdir) as db_url:
        server = start_server(db_url, workdir, args=("--app", "yoke_counter:app"), cwd=PEERS,
                              extra_env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PEERS), os.environ.get("PYTHONPATH", "")]))})
        try:
            headers = {"Authorization": f"Bearer {server.token}"}

            async def read_counts(keys: list[str]) -> dict[str, int]:
                counts: dict[str, int] = {}
                async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
                    ids: dict[str, str] = {}
                    after = None
                    while True:
                        page = await client.get("/v1/instances", params={"actor": "counter", "limit": 1000,
                                                                         **({"after": after} if after else {})})
                        page.raise_for_status()
                        listed = page.json()["instances"]
                        ids.update({i["key"]: i["id"] for i in listed})
                        if len(listed) < 1000:
                            break
                        after = listed[-1]["id"]
                    for chunk in range(0, len(keys), 64):
                        part = [k for k in keys[chunk : chunk + 64] if k in ids]
                        replies = await asyncio.gather(*(client.get(f"/v1/instances/{ids[k]}") for k in part))
                        for k, reply in zip(part, replies, strict=True):
                            reply.raise_for_status()
                            counts[k] = (reply.json()["state"]["value"] or {}).get("count", 0)
                return counts

            def send(key: str, item: dict[str, Any]) -> tuple[str, bytes]:
                return "/v1/streams/counters/-/events", orjson.dumps({"type": "count", "payload": {"k": key, **item}})

            yield System(f"yoke-{backend}", server, send, 201, read_counts, [server.process.pid],
                         database_of(db_url) if backend == "postgres" else None)
        finally:
            stop_server(server)


def system_under_test(name: str, workdir: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[System]:
    if name == "restate":
        return restate(workdir, env)
    return yoke(name.removeprefix("yoke-"), workdir, env)


# --- the load and the probes ----------------------------------------------------------


class Probes(asyncio.DatagramProtocol):
    """Receives the handlers' datagrams: when each input's run was done."""

    def __init__(self) -> None:
        self.done_at: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Future[float]] = {}
        self.all_done = asyncio.Event()
        self.expected = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        seq_text, at_text = data.split()
        seq, at = int(seq_text), float(at_text)
        self.done_at.setdefault(seq, at)
        waiter = self.waiters.pop(seq, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(at)
        if self.expected and len(self.done_at) >= self.expected:
            self.all_done.set()


def key_of(i: int, keys: int) -> str:
    return f"k{i % keys}"


@dataclass
class Figures:
    events_per_s: float = 0.0
    ack_p50_ms: float = 0.0
    ack_p99_ms: float = 0.0
    idle_p50_ms: float = 0.0
    idle_p99_ms: float = 0.0
    cpu_ms_per_1000: float = 0.0
    cores_busy: float = 0.0
    loadgen_cores: float = 0.0
    peak_rss_mib: float = 0.0


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM; the database server's is not counted)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


async def throughput(
    system: System, probes: Probes, events: int, keys: int, connections: int, figures: Figures,
    profile: Path | None = None,
) -> None:
    next_input = 0
    acks: list[float] = []
    loop = asyncio.get_running_loop()

    async def connection() -> None:
        nonlocal next_input
        async with RawConnection(system.server) as conn:
            while next_input < events:
                i = next_input
                next_input += 1
                target, body = system.send(key_of(i, keys), {"n": 1, "seq": i})
                sent = loop.time()
                status, answer = await conn.request("POST", target, body)
                if status != system.sent_status:
                    raise RuntimeError(f"{system.name} answered {status}: {answer[:300]!r}")
                acks.append(loop.time() - sent)

    probes.expected = events
    profiler = None
    if profile is not None and system.name.startswith("yoke"):
        profiler = Profiler(system.pids[0], 1, profile)
        await profiler.start()
    cpu_before, own_before = system.cpu_s(), time.process_time()
    start_wall, start = time.time(), loop.time()
    async with asyncio.TaskGroup() as group:
        for _ in range(connections):
            group.create_task(connection())
    sent_s = loop.time() - start
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while not probes.all_done.is_set():
        seen = len(probes.done_at)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STALL_S):
                await probes.all_done.wait()
        if len(probes.done_at) == seen and not probes.all_done.is_set():
            raise RuntimeError(f"{system.name}: {seen} of {events} runs done, none in the last {STALL_S:.0f} s")
        if loop.time() > deadline:
            raise RuntimeError(f"{system.name}: {len(probes.done_at)} of {events} runs done after {DRAIN_TIMEOUT_S} s")
    wall_s = max(probes.done_at[i] for i in range(events)) - start_wall
    cpu = system.cpu_s() - cpu_before
    own = time.process_time() - own_before
    if profiler is not None:
        print(await profiler.stop(), flush=True)
    acks.sort()
    figures.events_per_s = events / wall_s
    figures.ack_p50_ms, figures.ack_p99_ms = percentile(acks, 0.5) * 1000, percentile(acks, 0.99) * 1000
    figures.cpu_ms_per_1000 = cpu / events * 1000 * 1000
    figures.cores_busy = cpu / (loop.time() - start)
    figures.loadgen_cores = own / (loop.time() - start)
    figures.peak_rss_mib = sum(peak_rss_kib(pid) for pid in system.pids) / 1024
    print(f"    sent {events} in {sent_s:.1f} s, all done after {wall_s:.1f} s", flush=True)

    expected = {key_of(i, keys): 0 for i in range(keys)}
    for i in range(events):
        expected[key_of(i, keys)] += 1
    counts = await system.read_counts(sorted(expected))
    wrong = {k: (counts.get(k), n) for k, n in expected.items() if counts.get(k) != n}
    if wrong:
        sample = dict(list(wrong.items())[:5])
        raise RuntimeError(f"{system.name}: {len(wrong)} keys' state read back wrong (got, expected): {sample}")


async def idle_latency(system: System, probes: Probes, samples: int, first_seq: int, keys: int, figures: Figures) -> None:
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    async with RawConnection(system.server) as conn:
        for j in range(samples):
            seq = first_seq + j
            waiter: asyncio.Future[float] = loop.create_future()
            probes.waiters[seq] = waiter
            target, body = system.send(key_of(j, keys), {"n": 1, "seq": seq})
            sent = time.time()
            status, answer = await conn.request("POST", target, body)
            if status != system.sent_status:
                raise RuntimeError(f"{system.name} answered {status}: {answer[:300]!r}")
            async with asyncio.timeout(30):
                latencies.append(await waiter - sent)
    latencies.sort()
    figures.idle_p50_ms = percentile(latencies, 0.5) * 1000
    figures.idle_p99_ms = percentile(latencies, 0.99) * 1000


def one_run(name: str, scenario: str, args: argparse.Namespace) -> Figures:
    keys = MANY_KEYS if scenario == "keys" else args.keys
    figures = Figures()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)  # bursts are not dropped
        env = {"PEERS_PROBE_PORT": str(probe_socket.getsockname()[1]),
               "PEERS_EFFECT": "1" if scenario == "effect" else "0"}
        with tempfile.TemporaryDirectory(prefix=f"yoke-peers-{name}-") as tmp:
            with system_under_test(name, Path(tmp), env) as system:

                async def measure() -> None:
                    transport, probes = await asyncio.get_running_loop().create_datagram_endpoint(
                        Probes, sock=probe_socket)
                    try:
                        await throughput(system, probes, args.events, keys, args.connections, figures,
                                         Path(tmp) / "profile.txt" if args.profile else None)
                        await idle_latency(system, probes, args.samples, args.events, keys, figures)
                    finally:
                        transport.close()

                try:
                    asyncio.run(measure())
                except BaseException:
                    print(f"--- {name} logs (tail) ---", file=sys.stderr)
                    for log in sorted(Path(tmp).glob("*.log")):
                        print(f"{log.name}:\n{log.read_text()[-2000:]}", file=sys.stderr)
                    raise
    return figures


# --- report ----------------------------------------------------------------------


COLUMNS = [
    ("events/s", "events_per_s", "{:,.0f}"),
    ("ack p50 ms", "ack_p50_ms", "{:.1f}"),
    ("ack p99 ms", "ack_p99_ms", "{:.1f}"),
    ("idle done p50 ms", "idle_p50_ms", "{:.1f}"),
    ("idle done p99 ms", "idle_p99_ms", "{:.1f}"),
    ("CPU ms / 1,000 ev", "cpu_ms_per_1000", "{:,.0f}"),
    ("cores busy", "cores_busy", "{:.2f}"),
    ("load gen cores", "loadgen_cores", "{:.2f}"),
    ("peak RSS MiB", "peak_rss_mib", "{:,.0f}"),
]


def cell(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def table(results: dict[tuple[str, str], list[Figures]]) -> str:
    header = ["scenario", "system", *(c[0] for c in COLUMNS)]
    rows = [[scenario, name, *(cell([getattr(f, attr) for f in runs], fmt) for _, attr, fmt in COLUMNS)]
            for (scenario, name), runs in results.items()]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", action="store_true",
                        help="py-spy on yoke serve during the throughput phase (pip install py-spy first)")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"unknown system {s!r} (one of {', '.join(SYSTEMS)})")
    for s in scenarios:
        if s not in SCENARIOS:
            parser.error(f"unknown scenario {s!r} (one of {', '.join(SCENARIOS)})")
    signal.signal(signal.SIGTERM, interrupt)

    results: dict[tuple[str, str], list[Figures]] = {}
    for scenario in scenarios:
        for run in range(args.runs):
            for name in systems:  # systems interleaved: a slow phase of the machine hits each
                print(f"{scenario} / {name} / run {run + 1} of {args.runs}", flush=True)
                figures = one_run(name, scenario, args)
                results.setdefault((scenario, name), []).append(figures)
                print("    " + ", ".join(f"{label} {fmt.format(getattr(figures, attr))}"
                                         for label, attr, fmt in COLUMNS), flush=True)
    print()
    print(table(results))
    print(json.dumps({f"{scenario}/{name}": [vars(f) for f in runs] for (scenario, name), runs in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
