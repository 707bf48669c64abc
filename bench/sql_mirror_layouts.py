"""How to lay out the SQL catalogue's mirror: the measurements behind the
choice in docs/advanced/sql.md ("The choice, and what else was measured").

The question is the issue's query over one million instance rows (10,000
instances of 100 rows): ``SELECT status, count(*), sum(total) ... GROUP BY
status`` and a lookup by key, under each layout:

- sqlite-json: one table of rows with the values as a JSON text object,
  read with json_extract (SQLite 3.40 has no binary JSON);
- sqlite-typed: a table per actor table with a column per user column
  (what Yoke does on SQLite);
- postgres-jsonb: one table of rows with the values as jsonb, read through
  typed expressions (what Yoke does on PostgreSQL);
- federated: no mirror; open each instance's own SQLite file and query it
  (the cost of the files alone, before any merging of results).

    .venv/bin/python bench/sql_mirror_layouts.py [--instances 10000] [--rows 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

STATUSES = ("open", "paid", "shipped")
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def data(instances: int, rows: int) -> list[tuple[str, str, int, str, float, str]]:
    rng = random.Random(7)
    return [
        (f"inst_{i:06d}", f"k{i}", j, rng.choice(STATUSES), round(rng.random() * 100, 2), f"sku{j % 50}")
        for i in range(instances) for j in range(1, rows + 1)
    ]


def timed(fn, repeat: int = 5) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, max(times) * 1000


def sqlite_json(rows, folder: Path) -> tuple[float, float]:
    conn = sqlite3.connect(folder / "json.db")
    conn.execute(
        "CREATE TABLE r (tenant_id TEXT, actor TEXT, tbl TEXT, instance_id TEXT, rid INTEGER, key TEXT, data TEXT,"
        " PRIMARY KEY (tenant_id, actor, tbl, instance_id, rid)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX r_key ON r (tenant_id, actor, tbl, key)")
    conn.executemany(
        "INSERT INTO r VALUES ('t', 'order', 'orders', ?, ?, ?, ?)",
        [(i, j, k, json.dumps({"id": j, "status": s, "total": t, "sku": sku})) for i, k, j, s, t, sku in rows],
    )
    conn.commit()
    aggregate = timed(lambda: conn.execute(
        "SELECT json_extract(data, '$.status') s, count(*), sum(json_extract(data, '$.total')) FROM r"
        " WHERE tenant_id = 't' AND actor = 'order' AND tbl = 'orders' GROUP BY s"
    ).fetchall())
    lookup = timed(lambda: conn.execute(
        "SELECT json_extract(data, '$.sku') FROM r WHERE tenant_id = 't' AND actor = 'order' AND tbl = 'orders'"
        " AND key = 'k77'"
    ).fetchall(), 20)
    return aggregate[0], lookup[0]


def sqlite_typed(rows, folder: Path) -> tuple[float, float]:
    conn = sqlite3.connect(folder / "typed.db")
    conn.execute('CREATE TABLE r (tenant_id TEXT, instance_id TEXT, rid INTEGER, key TEXT, "u:id", "u:status", "u:total", "u:sku")')
    conn.execute("CREATE UNIQUE INDEX r_rows ON r (tenant_id, instance_id, rid)")
    conn.execute("CREATE INDEX r_keys ON r (tenant_id, key)")
    conn.executemany("INSERT INTO r VALUES ('t', ?, ?, ?, ?, ?, ?, ?)", [(i, j, k, j, s, t, sku) for i, k, j, s, t, sku in rows])
    conn.commit()
    view = 'SELECT instance_id, key, "u:id" AS id, "u:status" AS status, "u:total" AS total, "u:sku" AS sku FROM r WHERE tenant_id = \'t\''
    aggregate = timed(lambda: conn.execute(f"SELECT status, count(*), sum(total) FROM ({view}) GROUP BY status").fetchall())
    lookup = timed(lambda: conn.execute(f"SELECT sku FROM ({view}) WHERE key = 'k77'").fetchall(), 20)
    return aggregate[0], lookup[0]


def federated(rows, folder: Path, instances: int) -> tuple[float, float]:
    by_instance: dict[str, list] = {}
    for i, _k, j, s, t, sku in rows:
        by_instance.setdefault(i, []).append((j, s, t, sku))
    for i, items in by_instance.items():
        conn = sqlite3.connect(folder / f"{i}.db")
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, total REAL, sku TEXT)")
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", items)
        conn.commit()
        conn.close()

    def each() -> None:
        for i in by_instance:
            conn = sqlite3.connect(folder / f"{i}.db")
            conn.execute("SELECT status, count(*), sum(total) FROM orders GROUP BY status").fetchall()
            conn.close()

    return timed(each, 3)[0], float("nan")


async def postgres_jsonb(rows) -> tuple[float, float]:
    name = f"bench_layout_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(PG_ADMIN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + name)
        await conn.execute(
            "CREATE TABLE r (tenant_id text, instance_id text, tbl text, rid bigint, actor text, key text, data jsonb,"
            " PRIMARY KEY (tenant_id, instance_id, tbl, rid))"
        )
        await conn.execute("CREATE INDEX r_tables ON r (tenant_id, actor, tbl, key)")
        await conn.copy_records_to_table("r", records=[
            ("t", i, "orders", j, "order", k, json.dumps({"id": j, "status": s, "total": t, "sku": sku}))
            for i, k, j, s, t, sku in rows
        ])
        await conn.execute("VACUUM ANALYZE r")
        view = (
            "SELECT r.instance_id, r.key, r.data->>'status' AS status,"
            " CASE WHEN jsonb_typeof(r.data->'total') = 'number' THEN (r.data->'total')::float8 END AS total,"
            " r.data->>'sku' AS sku FROM r WHERE r.tenant_id = 't' AND r.actor = 'order' AND r.tbl = 'orders'"
        )

        async def run(sql: str, repeat: int) -> float:
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                await conn.fetch(sql)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1000

        aggregate = await run(f"SELECT status, count(*), sum(total) FROM ({view}) v GROUP BY status", 5)
        lookup = await run(f"SELECT sku FROM ({view}) v WHERE key = 'k77'", 20)
        await conn.close()
        return aggregate, lookup
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    args = parser.parse_args()
    rows = data(args.instances, args.rows)
    print(f"{args.instances} instances x {args.rows} rows = {len(rows):,} rows; median ms")
    print(f"{'layout':<16} {'GROUP BY status':>16} {'lookup by key':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for label, fn in (("sqlite-json", sqlite_json), ("sqlite-typed", sqlite_typed)):
            aggregate, lookup = fn(rows, folder)
            print(f"{label:<16} {aggregate:>16.0f} {lookup:>14.1f}")
        aggregate, lookup = asyncio.run(postgres_jsonb(rows))
        print(f"{'postgres-jsonb':<16} {aggregate:>16.0f} {lookup:>14.1f}")
        aggregate, _ = federated(rows, folder, args.instances)
        print(f"{'federated':<16} {aggregate:>16.0f} {'-':>14}  (opening and querying each file; no merge)")


if __name__ == "__main__":
    main()
