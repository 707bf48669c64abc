"""Yoke next to the Durable Streams reference server, over the protocol.

Starts, one at a time, the npm reference server (``@durable-streams/server``,
pinned in tests/durable_streams) file-backed (``dataDir``) and in memory, and
``yoke serve`` on SQLite and on PostgreSQL, and drives each with the same
load generator (bench/durable_streams_load.mjs, Node's fetch): 100 streams,
256-byte JSON messages,

  (a) 64 concurrent producers appending one message per request,
  (b) the same appending batches of 100,
  (c) catch-up reads by 200 clients of 1,000 messages each,

and prints messages/s with p50 / p99 request latency (for (c), a client's
whole read) as a table.

    .venv/bin/python bench/durable_streams.py [--seconds 10] [--only yoke-sqlite,...]

Needs the npm packages (``make npm``) and, for PostgreSQL, YOKE_BENCH_PG_URL
(default postgresql://postgres@127.0.0.1:5432/postgres; a database of its own
is created and dropped). Yoke runs durable (SQLite synchronous=FULL,
PostgreSQL's defaults: fsync on), with ``--dev`` (no token) and no access log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
NPM = ROOT / "tests" / "durable_streams"
LOAD = ROOT / "bench" / "durable_streams_load.mjs"
PG_URL = os.environ.get("YOKE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

REFERENCE = """
import {{ DurableStreamTestServer }} from "@durable-streams/server"
const server = new DurableStreamTestServer({{ port: {port}, host: "127.0.0.1", longPollTimeout: 20000{data} }})
await server.start()
console.log("ready")
process.on("SIGTERM", async () => {{ await server.stop(); process.exit(0) }})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url + "/v1/stream/__ready__", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


@contextmanager
def reference(work: Path, file_backed: bool) -> Iterator[str]:
    port = free_port()
    data = ""
    if file_backed:
        (work / "ref-data").mkdir()
        data = f', dataDir: {json.dumps(str(work / "ref-data"))}'
    script = NPM / f".bench-reference-{port}.mjs"  # resolves the pinned packages
    script.write_text(REFERENCE.format(port=port, data=data))
    log = work / f"reference-{port}.log"
    process = subprocess.Popen(["node", str(script)], cwd=NPM, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, log)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        script.unlink(missing_ok=True)


@contextmanager
def yoke(work: Path, db_url: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "YOKE_DATABASE_URL": db_url, "YOKE_DATA_DIR": str(work / ".yoke"),
           "YOKE_ACCESS_LOG": "0", "YOKE_PORT": str(port)}
    log = work / f"yoke-{port}.log"
    process = subprocess.Popen([sys.executable, "-m", "yoke.cli", "serve", "--dev"], cwd=work, env=env,
                               stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, log)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def pg_database() -> Iterator[str]:
    name = f"yoke_bench_ds_{uuid.uuid4().hex[:8]}"

    async def sql(statement: str) -> None:
        conn = await asyncpg.connect(PG_URL)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(sql(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def load(url: str, scenario: str, seconds: float) -> dict:
    run = subprocess.run(
        ["node", str(LOAD), url, scenario, f"seconds={seconds}", f"run={uuid.uuid4().hex[:8]}"],
        cwd=NPM, capture_output=True, text=True, timeout=600,
    )
    if run.returncode != 0:
        raise RuntimeError(f"load {scenario} failed: {run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


SERVERS = ["reference-file", "reference-memory", "yoke-sqlite", "yoke-postgres"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10, help="length of (a) and (b) (default 10)")
    parser.add_argument("--only", default=",".join(SERVERS), help="comma-separated: " + ", ".join(SERVERS))
    parser.add_argument("--scenarios", default="abc", help="which of a, b, c to run (default abc)")
    args = parser.parse_args()
    if shutil.which("node") is None or not (NPM / "node_modules" / "@durable-streams" / "server").is_dir():
        sys.exit("the npm packages are missing: run `make npm`")
    if not args.scenarios or set(args.scenarios) - set("abc"):
        sys.exit("--scenarios takes letters among a, b and c")
    rows = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix="yoke-bench-ds-") as tmp:
            work = Path(tmp)
            if name == "reference-file":
                server = reference(work, file_backed=True)
            elif name == "reference-memory":
                server = reference(work, file_backed=False)
            elif name == "yoke-sqlite":
                server = yoke(work, f"sqlite:///{work}/yoke.db")
            elif name == "yoke-postgres":
                with pg_database() as db_url:
                    with yoke(work, db_url) as url:
                        rows.append((name, [load(url, s, args.seconds) for s in args.scenarios]))
                        print(name, "done", file=sys.stderr)
                continue
            else:
                sys.exit(f"unknown server {name}")
            with server as url:
                rows.append((name, [load(url, s, args.seconds) for s in args.scenarios]))
            print(name, "done", file=sys.stderr)
    print(table(rows, args.scenarios))


TITLES = {"a": "(a) single", "b": "(b) batch-100", "c": "(c) catch-up"}


def table(rows: list[tuple[str, list[dict]]], scenarios: str) -> str:
    head = "| server | " + " | ".join(f"{TITLES[s]} msgs/s | p50 / p99 ms" for s in scenarios) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(scenarios)]
    for name, results in rows:
        cells = [name]
        for r in results:
            cells += [f"{r['msgs_per_s']:,.0f}", f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
