#!/usr/bin/env python
"""What idle subscriptions cost: a delivering process's CPU and the
database's transactions per second, with N copy subscriptions that have
nothing to deliver (no traffic, no lag).

Setup (this process, without an executor): ``--subscriptions`` (2,000) copy
subscriptions, each on a source stream of its own (``/src/<i>`` copied to
``/dst/<i>``), spread over ``--tenants`` (1) tenants, and their catalogues
recorded (the work the first delivering process would do at its start).
Then ``--processes`` (1) delivering processes are started (this file with
``--deliver URL``: a runtime with the delivery engine and nothing else, idle
until SIGTERM). Once every subscription is held and ``--settle`` (30) more
seconds have passed, the window of ``--seconds`` (30) is measured:

- each delivering process's CPU (user + system, /proc), as % of one core;
- PostgreSQL: the database's transactions per second (``pg_stat_database``
  xact_commit + xact_rollback of the bench database, before and after; the
  statistics reach that view within a second or so of each transaction, a
  few of an idle backend's up to 10 s later: the window is long enough);
- how many subscriptions each process holds (the leases' spread).

Targets (issue 40): under 2% of a core and under 50 transactions/s with
2,000 idle subscriptions.

    .venv/bin/python bench/idle_subscriptions.py [--backend postgres|sqlite|all]
        [--subscriptions 2000] [--tenants 1] [--processes 1] [--seconds 30] [--settle 30]

PostgreSQL: a scratch database made through ``YOKE_BENCH_PG_URL`` (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end; SQLite:
a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yoke  # noqa: E402
from yoke.subscriptions.management import rebuild_stale_catalogues  # noqa: E402

PG_URL = os.environ.get("YOKE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TICKS = os.sysconf("SC_CLK_TCK")


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def deliver(url: str) -> None:
    """A delivering process: the runtime's delivery engine, idle."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with yoke.open(url, data_dir=tempfile.mkdtemp(prefix="yoke-idle-")):
        print("ready", flush=True)
        await stop.wait()


async def create(url: str, subscriptions: int, tenants: int) -> None:
    async with yoke.open(url, executor=False, data_dir=tempfile.mkdtemp(prefix="yoke-idle-")) as y:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                src = y.stream(f"/src/{i}", f"t{i % tenants}")
                await src.subscribe(f"copy{i}", yoke.copy_to_stream(f"/dst/{i}"))

        await asyncio.gather(*(one(i) for i in range(subscriptions)))
        # What the first delivering process would do at its start: each new
        # subscription's catalogue recorded (rebuilt from its stream).
        await rebuild_stale_catalogues(y)


class Catalogue:
    """The database as its owner sees it."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def _fetch(self, sql: str) -> list[tuple]:
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        conn = await asyncpg.connect(self.url)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    async def held(self) -> dict[str, int]:
        """Subscriptions held, by lease owner."""
        return dict(await self._fetch(
            "SELECT lease_owner, count(*) FROM subscriptions WHERE lease_owner IS NOT NULL GROUP BY 1"
        ))

    async def rebuilt(self) -> int:
        """Source streams whose subscription catalogue is recorded."""
        return (await self._fetch("SELECT count(*) FROM subscription_catalogues WHERE stage IS NULL"))[0][0]


async def transactions(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()


async def measure(url: str, args: argparse.Namespace) -> dict[str, object]:
    started = time.monotonic()
    await create(url, args.subscriptions, args.tenants)
    created_s = time.monotonic() - started
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--deliver", url], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(args.processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        catalogue = Catalogue(url)
        deadline = time.monotonic() + 600
        while (
            sum((await catalogue.held()).values()) < args.subscriptions
            or await catalogue.rebuilt() < args.subscriptions
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"not every subscription held and catalogued after 600 s: {await catalogue.held()}")
            await asyncio.sleep(0.5)
        started_s = time.monotonic() - started - created_s
        await asyncio.sleep(args.settle)  # start-up work done, statistics flushed
        pg = not url.startswith("sqlite")
        tx0 = await transactions(url) if pg else 0
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        t0 = time.monotonic()
        await asyncio.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        cpu = [round((cpu_seconds(p.pid) - c) / elapsed * 100, 2) for p, c in zip(procs, cpu0, strict=True)]
        tx = round((await transactions(url) - tx0) / elapsed, 1) if pg else None
        spread = sorted((await catalogue.held()).values(), reverse=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
    return {
        "backend": "postgres" if pg else "sqlite", "subscriptions": args.subscriptions, "tenants": args.tenants,
        "processes": args.processes, "cpu_percent": cpu, "transactions_per_s": tx, "held": spread,
        "window_s": round(elapsed, 1), "setup_s": round(created_s, 1), "start_s": round(started_s, 1),
    }


async def run(backend: str, args: argparse.Namespace) -> dict[str, object]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="yoke-idle-") as folder:
            return await measure(f"sqlite:///{folder}/yoke.db", args)
    name = f"yoke_idle_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        return await measure(with_database(PG_URL, name), args)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["postgres", "sqlite", "all"], default="all")
    parser.add_argument("--subscriptions", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--deliver", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.deliver:
        asyncio.run(deliver(args.deliver))
        return
    if args.processes > 1 and args.backend != "postgres":
        parser.error("--processes > 1 needs --backend postgres (one process per SQLite file)")
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    for backend in backends:
        result = asyncio.run(run(backend, args))
        tx = "" if result["transactions_per_s"] is None else f", {result['transactions_per_s']} transactions/s"
        print(
            f"{backend}: {args.subscriptions} idle subscriptions over {args.tenants} tenant(s),"
            f" {args.processes} process(es): CPU {result['cpu_percent']} % of a core{tx};"
            f" held {result['held']}"
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
