"""The SQLite writer's multi-row INSERTs (store/sqlite/group_writes.py):
blocks of any sizes, cut across statements, with NULL and shared columns
or without, store exactly the rows they describe, each in a block
(store/sqlite/event_blocks.py)."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from yoke.events import prepare
from yoke.store.sqlite.group_writes import INSERT_COLUMNS, Block, insert_events
from yoke.store.sqlite.migrate import migrations as _migrations

from ..contract.test_sqlite_event_blocks import INTACT, blocks_broken

RAW = st.sampled_from([
    {"type": "plain", "payload": 1},
    {"type": "other", "payload": "x"},
    {"type": "full", "payload": {"n": 1}, "source": {"app": "a"}, "correlation": "c", "group_id": "g",
     "metadata": {"m": 1}, "priority": 3},
    {"type": "keyed", "idempotency_key": "k"},  # unique per stream: made distinct below
])
BLOCK = st.tuples(st.sampled_from(["t1", "t2"]), st.lists(RAW, min_size=1, max_size=40), st.booleans())


def _events_table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for m in _migrations():
        conn.executescript(m.sql)
    return conn


@settings(max_examples=60, deadline=None)
@given(st.lists(BLOCK, min_size=1, max_size=12), st.sampled_from([1, 2, 8, 64, 1024]))
def test_blocks_are_stored_as_described(blocks, cap):
    import yoke.store.sqlite.group_writes as gw

    conn = _events_table()
    made, expected = [], []
    for n, (tenant, raws, gaps) in enumerate(blocks):
        events = [prepare({**r, "idempotency_key": f"k{n}-{i}"} if "idempotency_key" in r else r)
                  for i, r in enumerate(raws)]
        seqs = [1 + 2 * i for i in range(len(events))] if gaps else range(1, len(events) + 1)
        block = Block(tenant, n, 1000 + n, seqs, events)
        made.append(block)
        for seq, e in zip(seqs, events):
            expected.append((tenant, n, seq, e.id, 1000 + n, e.type, e.payload_json, e.metadata_json, e.source_json,
                             e.correlation, e.priority, e.group_id, e.idempotency_key, e.fingerprint, e.size, e.data))
    saved = gw.INSERT_CHUNK
    gw.INSERT_CHUNK = cap
    try:
        insert_events(conn, made)
    finally:
        gw.INSERT_CHUNK = saved
    stored = conn.execute(f"SELECT {', '.join(INSERT_COLUMNS)} FROM event_rows ORDER BY sid, seq").fetchall()
    assert stored == expected
    assert blocks_broken(conn) == INTACT  # and each row is found through its block
