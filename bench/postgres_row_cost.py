#!/usr/bin/env python
"""What a Durable Streams batch costs PostgreSQL itself, row by row.

The Durable Streams bench's (b) on PostgreSQL is bound by the cores the
database needs (docs/advanced/durable-streams.md). This measures that cost without
HTTP, the event loop or the load generator: one connection appends batches
of 100 protocol messages of 256 bytes (made by the route's ``events_of``)
to 100 streams in turn, one transaction a batch, and reads the CPU time of
the server process serving it (``/proc/PID/stat``, so PostgreSQL must run on
this machine), per row:

  yoke_append   the statement ``yoke serve`` sends (its arguments built by
                the store's own code): the stream row lock, the rows through
                ``unnest``, the counters, the notification;
  bare insert   the same rows by a plain ``INSERT ... SELECT FROM unnest`` of
                the columns that differ, into the same table: what any
                append of these rows costs, whatever the code around it.

    .venv/bin/python bench/postgres_row_cost.py [--batches 500]

Runs in a scratch database made through YOKE_BENCH_PG_URL (bench/append.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from append import scratch  # bench/append.py (scripts run from bench/)  # noqa: E402

import asyncpg  # noqa: E402
import orjson  # noqa: E402

from yoke.clock import SYSTEM, wall_ms  # noqa: E402
from yoke.http.durable_streams.messages import events_of  # noqa: E402
from yoke.store.postgres.migrate import migrate  # noqa: E402
from yoke.store.postgres.appends import APPEND, append_args as _append_args  # noqa: E402

STREAMS = 100
BATCH = 100
BARE_INSERT = (
    "INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, size)"
    " SELECT 'default', $1, $2 + t.ord, t.id, $3, 'ds.message', t.payload::json, '{}', t.size"
    " FROM unnest($4::text[], $5::text[], $6::integer[]) WITH ORDINALITY AS t(id, payload, size, ord)"
)


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def batch_body(n: int) -> bytes:
    pad = "x" * (256 - len(orjson.dumps({"n": n, "pad": ""})))
    return orjson.dumps([{"n": n * BATCH + i, "pad": pad} for i in range(BATCH)])


async def timed(conn: asyncpg.Connection, pid: int, batches: int, append) -> tuple[float, float]:
    """(server CPU µs, wall µs) per row over ``batches`` appends."""
    for n in range(10):  # warm the plans and caches
        await append(n)
    cpu, wall = server_cpu_s(pid), time.perf_counter()
    for n in range(batches):
        await append(10 + n)
    rows = batches * BATCH
    return (server_cpu_s(pid) - cpu) / rows * 1e6, (time.perf_counter() - wall) / rows * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=500, help="timed batches per case (default 500)")
    args = parser.parse_args()
    async with scratch("postgres") as (url, _):
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            pid = await conn.fetchval("SELECT pg_backend_pid()")

            async def yoke_append(n: int) -> None:
                events = events_of(batch_body(n), "application/json")
                path = f"/bench/{n % STREAMS}"
                await conn.fetch(APPEND, *_append_args("default", path, events, [0] * BATCH, wall_ms(SYSTEM), f"s{n}"))

            heads: dict[int, int] = {}

            async def bare_insert(n: int) -> None:
                events = events_of(batch_body(n), "application/json")
                sid = 1_000_000 + n % STREAMS  # streams of their own: no stream row to lock
                head = heads.get(sid, 0)
                async with conn.transaction():
                    await conn.execute(BARE_INSERT, sid, head, wall_ms(SYSTEM), [e.id for e in events],
                                       [e.payload_json for e in events], [e.size for e in events])
                heads[sid] = head + BATCH

            print(f"{BATCH} rows a transaction, {args.batches} transactions, one connection")
            for name, append in (("yoke_append", yoke_append), ("bare insert", bare_insert)):
                cpu, wall = await timed(conn, pid, args.batches, append)
                print(f"{name:12}  PostgreSQL CPU {cpu:5.1f} µs/row   wall {wall:5.1f} µs/row")
        finally:
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
