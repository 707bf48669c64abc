#!/usr/bin/env python
"""Append benchmark: Yoke against what the database alone can do.

For PostgreSQL and for SQLite, in one run:

(a) raw limit: rows shaped exactly like Yoke's ``events`` rows, written by
    the driver alone in batches of 1000, one transaction per batch, into a
    scratch table with the same columns and indexes (asyncpg
    ``copy_records_to_table``; stdlib sqlite3 ``executemany`` with WAL and
    synchronous=FULL, as Yoke runs SQLite). Rows are built before timing.
(a64) fair limit for 64 producers: the same rows written by the driver in
    groups of 64, one transaction per group, one group after another: what
    64 producers each waiting for its own append can at best be committed
    as (a group never holds more than 64 events).
(b) naive path: one transaction per event -- bump a per-tenant counter
    (upsert ... RETURNING) then insert the event row; one connection,
    sequential.
(c) Yoke through the public API (``yoke.open(url)``, ``stream.append``):
    1 producer appending single events one after another (p50/p99 latency
    per append), and 64 producers (asyncio tasks) appending single events
    concurrently to one stream (events/s; group commit).

Targets on the 2-core machine, PostgreSQL: (c) at 64 producers >= 60% of
(a64) and >= 20x (b); single-producer p50 <= 1.2 ms.

PostgreSQL runs in a scratch database created through ``YOKE_BENCH_PG_URL``
(default postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the
end; SQLite runs in a temporary directory, removed at the end. The last line
printed is one JSON object with every figure.

    python bench/append.py [--backend all|postgres|sqlite] [--quick] [--keyed]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

import yoke
from yoke.events import prepare
from yoke.clock import SYSTEM, wall_ms

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TENANT = "bench"
SID = 1
BATCH = 1000
GROUP = 64  # (a64): what 64 waiting producers can at most give one transaction

COLUMNS = (
    "tenant_id", "sid", "seq", "id", "at", "type", "payload", "metadata", "source",
    "correlation", "priority", "group_id", "idempotency_key", "fingerprint", "size",
)  # fmt: skip

# Scratch tables: the columns, key and index of each backend's ``events``.
PG_SCHEMA = """
CREATE TABLE {table} (
    tenant_id text NOT NULL, sid bigint NOT NULL, seq bigint NOT NULL, id text NOT NULL,
    at bigint NOT NULL, type text NOT NULL, payload jsonb NOT NULL, metadata jsonb NOT NULL,
    source jsonb, correlation text, priority integer NOT NULL DEFAULT 0, group_id text,
    idempotency_key text, fingerprint text, size integer NOT NULL,
    PRIMARY KEY (tenant_id, sid, seq));
CREATE UNIQUE INDEX ON {table} (tenant_id, sid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
SQLITE_SCHEMA = """
CREATE TABLE {table} (
    tenant_id TEXT NOT NULL, sid INTEGER NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
    at INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL, metadata TEXT NOT NULL,
    source TEXT, correlation TEXT, priority INTEGER NOT NULL DEFAULT 0, group_id TEXT,
    idempotency_key TEXT, fingerprint TEXT, size INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, sid, seq)) WITHOUT ROWID;
CREATE UNIQUE INDEX {table}_idempotency ON {table} (tenant_id, sid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
COUNTERS_SCHEMA = "CREATE TABLE counters (tenant_id text PRIMARY KEY, next_seq bigint NOT NULL);"

PG_BUMP = (
    "INSERT INTO counters (tenant_id, next_seq) VALUES ($1, 2) ON CONFLICT (tenant_id)"
    " DO UPDATE SET next_seq = counters.next_seq + 1 RETURNING next_seq - 1"
)
PG_INSERT = (
    f"INSERT INTO naive_events ({', '.join(COLUMNS)})"
    f" VALUES ({', '.join(f'${i}' for i in range(1, 16))})"
)
SQLITE_BUMP = PG_BUMP.replace("$1", "?")
SQLITE_INSERT = f"INSERT INTO {{table}} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 15)})"


@dataclass(frozen=True)
class Counts:
    raw: int  # (a) rows
    naive: int  # (b) events
    warmup: int  # (c) appends before the latency sample
    single: int  # (c) 1 producer: appends timed
    producers: int  # (c) concurrent producers
    per_producer: int  # (c) appends per concurrent producer
    keyed: bool = False  # (c) every event carries a new idempotency key


FULL = Counts(raw=100_000, naive=2000, warmup=200, single=2000, producers=64, per_producer=300)
QUICK = Counts(raw=10_000, naive=300, warmup=50, single=300, producers=64, per_producer=50)


# --- the event --------------------------------------------------------------


def new_event(i: int, keyed: bool = False) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "order.placed",
        "payload": {"order_id": i, "sku": "ABC-123", "qty": 2, "note": "x" * 64},
    }
    if keyed:  # as every append an actor run journals does (docs/advanced/effects.md)
        event["idempotency_key"] = f"k-{uuid.uuid4().hex}"
    return event


def event_row(seq: int) -> tuple[Any, ...]:
    """The ``events`` row Yoke would store for ``new_event(seq)`` at offset ``seq``."""
    e = prepare(new_event(seq))
    return (
        TENANT, SID, seq, e.id, wall_ms(SYSTEM), e.type, e.payload_json, e.metadata_json, e.source_json,
        e.correlation, e.priority, e.group_id, e.idempotency_key, e.fingerprint, e.size,
    )  # fmt: skip


def say(backend: str, label: str, value: str) -> None:
    print(f"{backend:<8} {label:<58} {value}", flush=True)


# --- (c) Yoke, either backend ------------------------------------------------


async def yoke_single(y: yoke.Runtime, counts: Counts) -> tuple[float, float]:
    """1 producer, sequential single-event appends: (p50 ms, p99 ms)."""
    stream = y.stream("/bench/single")
    for i in range(counts.warmup):
        await stream.append(new_event(i, counts.keyed))
    latencies = []
    for i in range(counts.single):
        event = new_event(i, counts.keyed)
        start = time.perf_counter()
        await stream.append(event)
        latencies.append((time.perf_counter() - start) * 1000)
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49], cuts[98]


async def yoke_concurrent(y: yoke.Runtime, counts: Counts) -> float:
    """``counts.producers`` tasks appending single events to one stream: events/s."""
    stream = y.stream("/bench/concurrent")
    await stream.append(new_event(0, counts.keyed))  # create the stream outside the timing

    async def producer(p: int) -> None:
        for i in range(counts.per_producer):
            await stream.append(new_event(p * counts.per_producer + i, counts.keyed))

    start = time.perf_counter()
    await asyncio.gather(*(producer(p) for p in range(counts.producers)))
    return counts.producers * counts.per_producer / (time.perf_counter() - start)


async def measure_yoke(backend: str, url: str, counts: Counts) -> tuple[float, float, float]:
    async with yoke.open(url) as y:
        p50, p99 = await yoke_single(y, counts)
        label = "(c) yoke, 1 producer: append latency p50 / p99"
        say(backend, label, f"{p50:.3f} / {p99:.3f} ms")
        eps = await yoke_concurrent(y, counts)
        label = f"(c) yoke, {counts.producers} producers: single-event appends"
        say(backend, label, f"{eps:,.0f} events/s")
    return p50, p99, eps


def figures(raw: float, raw64: float, naive: float, p50: float, p99: float, eps64: float) -> dict[str, float]:
    return {
        "raw_batched_eps": round(raw),
        "raw_64_eps": round(raw64),
        "yoke_64_vs_raw64": round(eps64 / raw64, 3),
        "naive_eps": round(naive),
        "yoke_1_p50_ms": round(p50, 3),
        "yoke_1_p99_ms": round(p99, 3),
        "yoke_64_eps": round(eps64),
        "yoke_64_vs_raw": round(eps64 / raw, 3),
        "yoke_64_vs_naive": round(eps64 / naive, 2),
    }


# --- PostgreSQL ---------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextlib.asynccontextmanager
async def pg_scratch_database(admin_url: str) -> AsyncIterator[str]:
    """A fresh database (URL yielded), dropped on the way out, error or not."""
    name = "yoke_bench_" + os.urandom(6).hex()
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield with_database(admin_url, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def scratch(backend: str) -> AsyncIterator[tuple[str, Path]]:
    """(database url, data_dir) of a fresh database on ``backend`` (the
    other bench scripts use it too)."""
    with tempfile.TemporaryDirectory(prefix="yoke_bench_") as folder:
        if backend == "sqlite":
            yield f"sqlite:///{Path(folder) / 'yoke.db'}", Path(folder)
        else:
            admin_url = os.environ.get("YOKE_BENCH_PG_URL", DEFAULT_PG_URL)
            async with pg_scratch_database(admin_url) as url:
                yield url, Path(folder)


async def pg_raw(conn: asyncpg.Connection, counts: Counts, batch: int = BATCH, first: int = 1) -> float:
    """(a) COPY batches of ``batch`` rows, each its own transaction: events/s."""
    rows = [event_row(seq) for seq in range(first, first + counts.raw)]
    start = time.perf_counter()
    for i in range(0, len(rows), batch):
        await conn.copy_records_to_table("raw_events", records=rows[i : i + batch], columns=COLUMNS)
    return len(rows) / (time.perf_counter() - start)


async def pg_naive(conn: asyncpg.Connection, counts: Counts) -> float:
    """(b) One transaction per event: counter upsert, then the row: events/s."""
    start = time.perf_counter()
    for _ in range(counts.naive):
        async with conn.transaction():
            seq = await conn.fetchval(PG_BUMP, TENANT)
            await conn.execute(PG_INSERT, *event_row(seq))
    return counts.naive / (time.perf_counter() - start)


async def run_postgres(admin_url: str, counts: Counts) -> dict[str, float]:
    async with pg_scratch_database(admin_url) as url:
        conn = await asyncpg.connect(url)
        try:
            version, sync = await conn.fetchrow("SELECT version(), current_setting('synchronous_commit')")
            say("postgres", "server", f"{version.split(' on ')[0]}, synchronous_commit={sync}")
            schema = PG_SCHEMA.format(table="raw_events") + PG_SCHEMA.format(table="naive_events")
            await conn.execute(schema + COUNTERS_SCHEMA)
            raw = await pg_raw(conn, counts)
            say("postgres", f"(a) raw: COPY {BATCH} rows per transaction", f"{raw:,.0f} events/s")
            raw64 = await pg_raw(conn, counts, GROUP, first=counts.raw + 1)
            say("postgres", f"(a64) fair limit: COPY {GROUP} rows per transaction", f"{raw64:,.0f} events/s")
            naive = await pg_naive(conn, counts)
            say("postgres", "(b) naive: 1 transaction per event (upsert + insert)", f"{naive:,.0f} events/s")
        finally:
            await conn.close()
        p50, p99, eps = await measure_yoke("postgres", url, counts)
    return figures(raw, raw64, naive, p50, p99, eps)


# --- SQLite ---------------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    """Autocommit connection set up as Yoke's: WAL, synchronous=FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def sqlite_raw(conn: sqlite3.Connection, counts: Counts, batch: int = BATCH, first: int = 1) -> float:
    """(a) ``executemany`` of ``batch`` rows per transaction: events/s."""
    rows = [event_row(seq) for seq in range(first, first + counts.raw)]
    insert = SQLITE_INSERT.format(table="raw_events")
    start = time.perf_counter()
    for i in range(0, len(rows), batch):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows[i : i + batch])
        conn.execute("COMMIT")
    return len(rows) / (time.perf_counter() - start)


def sqlite_naive(conn: sqlite3.Connection, counts: Counts) -> float:
    """(b) One transaction per event: counter upsert, then the row: events/s."""
    insert = SQLITE_INSERT.format(table="naive_events")
    start = time.perf_counter()
    for _ in range(counts.naive):
        conn.execute("BEGIN IMMEDIATE")
        seq = conn.execute(SQLITE_BUMP, (TENANT,)).fetchall()[0][0]
        conn.execute(insert, event_row(seq))
        conn.execute("COMMIT")
    return counts.naive / (time.perf_counter() - start)


async def run_sqlite(counts: Counts) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="yoke_bench_") as folder:
        with contextlib.closing(sqlite_connect(Path(folder) / "scratch.db")) as conn:
            say("sqlite", "library", f"{sqlite3.sqlite_version}, journal_mode=WAL, synchronous=FULL")
            schema = SQLITE_SCHEMA.format(table="raw_events") + SQLITE_SCHEMA.format(table="naive_events")
            conn.executescript(schema + COUNTERS_SCHEMA)
            raw = sqlite_raw(conn, counts)
            say("sqlite", f"(a) raw: executemany {BATCH} rows per transaction", f"{raw:,.0f} events/s")
            raw64 = sqlite_raw(conn, counts, GROUP, first=counts.raw + 1)
            say("sqlite", f"(a64) fair limit: executemany {GROUP} rows per transaction", f"{raw64:,.0f} events/s")
            naive = sqlite_naive(conn, counts)
            say("sqlite", "(b) naive: 1 transaction per event (upsert + insert)", f"{naive:,.0f} events/s")
        p50, p99, eps = await measure_yoke("sqlite", f"sqlite:///{Path(folder) / 'yoke.db'}", counts)
    return figures(raw, raw64, naive, p50, p99, eps)


# --- main -------------------------------------------------------------------------


def check_postgres_targets(f: dict[str, float]) -> None:
    for label, ok in (
        ("(c)64 >= 60% of (a64)", f["yoke_64_vs_raw64"] >= 0.60),
        ("(c)64 >= 20x (b)", f["yoke_64_vs_naive"] >= 20),
        ("(c)1 p50 <= 1.2 ms", f["yoke_1_p50_ms"] <= 1.2),
    ):
        say("postgres", f"target {label}", "met" if ok else "MISSED")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("all", "postgres", "sqlite"), default="all")
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    parser.add_argument("--keyed", action="store_true",
                        help="(c) appends carry a new idempotency key each, as journaled actor appends do")
    args = parser.parse_args(argv)
    counts = replace(QUICK if args.quick else FULL, keyed=args.keyed)

    results: dict[str, dict[str, float]] = {}
    if args.backend in ("all", "postgres"):
        admin_url = os.environ.get("YOKE_BENCH_PG_URL", DEFAULT_PG_URL)
        results["postgres"] = await run_postgres(admin_url, counts)
        check_postgres_targets(results["postgres"])
    if args.backend in ("all", "sqlite"):
        results["sqlite"] = await run_sqlite(counts)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
