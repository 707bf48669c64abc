"""How long a /metrics scrape takes, and how many series it returns, with many
tenants (docs/production/metrics.md).

Fills a new PostgreSQL database with --tenants tenants (a stream with one
event each; every tenth also a copy subscription), starts a real
`yoke serve` on it, lets its first database sample complete (when the build
samples in the background), then scrapes --scrapes times and prints the
scrape's time (min, median, max), its series and its bytes, and the
background pass's duration when the build reports it.

Run it against another build's code with PYTHONPATH pointing at that
build's source tree (the subprocess inherits it):

    .venv/bin/python bench/metrics_scrape.py --tenants 2000
    git archive <commit> | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python bench/metrics_scrape.py --tenants 2000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

ADMIN_URL = os.environ.get("YOKE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def fill(url: str, tenants: int) -> None:
    import yoke

    async with yoke.open(url, executor=False) as y:
        async def one(i: int) -> None:
            tenant = f"bench-{i:05d}"
            s = y.stream("/orders", tenant)
            await s.append({"type": "order.placed", "payload": {"n": i}})
            if i % 10 == 0:
                await s.subscribe("archive", yoke.copy_to_stream("/archive"))

        for start in range(0, tenants, 50):  # 50 at a time: the pool's size bounds it anyway
            await asyncio.gather(*(one(i) for i in range(start, min(start + 50, tenants))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample_age(text: str) -> float | None:
    found = re.search(r"^yoke_metrics_sample_age_seconds (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()

    name = f"yoke_bench_metrics_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = with_database(ADMIN_URL, name)
    data = Path(tempfile.mkdtemp(prefix="yoke-bench-metrics-"))
    server = None
    try:
        started = time.perf_counter()
        asyncio.run(fill(url, args.tenants))
        print(f"filled {args.tenants} tenants in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        port = free_port()
        env = {**os.environ, "YOKE_DATABASE_URL": url, "YOKE_DATA_DIR": str(data), "YOKE_PORT": str(port),
               "YOKE_ACCESS_LOG": "0"}
        server = subprocess.Popen([sys.executable, "-m", "yoke.cli", "serve"], env=env, cwd=data,
                                  stdout=subprocess.DEVNULL, stderr=open(data / "server.log", "w"))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # ready, and (when the build samples in the background) sampled once
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    text = httpx.get(base + "/metrics", timeout=60).text
                    age = sample_age(text)
                    if age is None or age >= 0:
                        break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"yoke serve did not come up: {(data / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
        times, sizes, series = [], [], []
        with httpx.Client(timeout=120) as client:
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                text = client.get(base + "/metrics").text
                times.append(time.perf_counter() - t0)
                sizes.append(len(text.encode()))
                series.append(sum(1 for line in text.splitlines() if line and not line.startswith("#")))
        passed = re.search(r"^yoke_metrics_sample_duration_seconds (\S+)$", text, re.M)
        print(
            f"{args.tenants} tenants: scrape min {min(times) * 1000:.1f} ms, median"
            f" {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms;"
            f" {series[-1]} series, {sizes[-1] / 1024:.0f} KiB"
            + (f"; background pass {float(passed.group(1)):.2f} s" if passed else "; sampled at scrape")
        )
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
