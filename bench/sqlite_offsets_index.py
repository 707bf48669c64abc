#!/usr/bin/env python
"""What the SQLite writer's way of finding events by offset costs it: the
blocks (event_blocks, migration 0014), the per-row offsets index they
replaced (migration 0013), neither.

The Durable Streams bench's (b) on SQLite is bound by the writer thread
(docs/advanced/durable-streams.md). This runs the writer's own statements without
the server: groups of 28 batches of 100 protocol messages of 256 bytes
(made by the route's ``message_events``), each batch to one of 100 streams
in turn, written by ``GroupWrites`` (the store's code) in one transaction
a group, WAL, synchronous=FULL, 8 KiB pages, the store's migrations; for
each layout, rows/s, the process's CPU per row, the time in the writes and
in COMMIT, and bytes written per row (``/proc/self/io``, WAL and
checkpoints):

  blocks  the schema as it is: one event_blocks row per run of a stream's
          rows (here a batch), written with them;
  index   a unique index on (tenant, stream, offset), an entry per row,
          each batch inserted in the middle of it, and no block rows (the
          layout before migration 0014);
  none    neither: the floor.

    .venv/bin/python bench/sqlite_offsets_index.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from yoke.events import new_event_ids  # noqa: E402
from yoke.http.durable_streams.messages import message_events  # noqa: E402
from yoke.store.sqlite import group_writes  # noqa: E402
from yoke.store.sqlite.group_writes import Block, GroupWrites  # noqa: E402
from yoke.store.sqlite.connection import PAGE_SIZE  # noqa: E402
from yoke.store.sqlite.migrate import migrate  # noqa: E402

STREAMS = 100
BATCHES_A_GROUP = 28  # what a group of (b) holds: about 2,850 messages
BATCH = 100


def written_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def database(path: Path, layout: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    migrate(conn)  # the store's own schema, as yoke serve makes it
    if layout == "index":
        conn.execute("CREATE UNIQUE INDEX event_rows_offsets ON event_rows (tenant_id, sid, seq)")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO streams (tenant_id, path, sid, stream_id, created_at) VALUES ('default', ?, ?, 'bench', 0)",
        [(f"/s{s}", s + 1) for s in range(STREAMS)],
    )
    conn.execute("COMMIT")
    return conn


def run(layout: str, seconds: float, directory: Path) -> dict[str, float]:
    conn = database(directory / f"{layout}.db", layout)
    texts = ['{"at":1764640000000,"n":%d,"pad":"%s"}' % (i, "x" * 220) for i in range(BATCH)]
    heads = [0] * STREAMS
    spent: collections.Counter[str] = collections.Counter()
    rows = groups = 0
    start, cpu, written = time.perf_counter(), time.process_time(), written_bytes()
    while time.perf_counter() - start < seconds:
        held = GroupWrites()
        conn.execute("BEGIN IMMEDIATE")
        for k in range(BATCHES_A_GROUP):
            s = (groups * BATCHES_A_GROUP + k) % STREAMS
            events = message_events(texts, new_event_ids(BATCH))
            held.blocks.append(Block("default", s + 1, 0, range(heads[s] + 1, heads[s] + BATCH + 1), events))
            held.advance("default", s + 1, heads[s] + BATCH, BATCH, BATCH * 270, False)
            heads[s] += BATCH
        began = time.perf_counter()
        held.write(conn)
        wrote = time.perf_counter()
        conn.execute("COMMIT")
        spent["write"] += wrote - began
        spent["commit"] += time.perf_counter() - wrote
        rows += BATCHES_A_GROUP * BATCH
        groups += 1
    elapsed = time.perf_counter() - start
    result = {
        "rows_per_s": rows / elapsed,
        "cpu_us_per_row": (time.process_time() - cpu) / rows * 1e6,
        "write_us_per_row": spent["write"] / rows * 1e6,
        "commit_us_per_row": spent["commit"] / rows * 1e6,
        "bytes_per_row": (written_bytes() - written) / rows,
    }
    conn.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10, help="length of each layout's run (default 10)")
    args = parser.parse_args()
    print("| layout | rows/s | CPU µs/row | write µs/row | COMMIT µs/row | bytes written/row |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as directory:
        for layout in ("blocks", "index", "none"):
            if layout != "blocks":  # the writer's code, without its block rows
                group_writes.merged = lambda runs: []
            r = run(layout, args.seconds, Path(directory))
            print(f"| {layout} | {r['rows_per_s']:,.0f} | {r['cpu_us_per_row']:.2f} | {r['write_us_per_row']:.2f}"
                  f" | {r['commit_us_per_row']:.2f} | {r['bytes_per_row']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
