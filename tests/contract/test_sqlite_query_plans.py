"""Every statement the SQLite store runs on its events finds their rows by
row id or through an index, never by scanning a table: event_rows is keyed
by row id alone, its rows found by offset through event_blocks (migration
0014, store/sqlite/event_blocks.py), so a query that scanned either would
read every event of every stream.

The statements are the ones the store really runs (traced on each of its
connections) through appends, idempotent repeats, reads short and long,
acks, retention, the Durable Streams routes' store calls (a fork among
them), the subscription store's reads and a delete; the migrations' own
statements aside."""

from __future__ import annotations

import re
import sqlite3

import yoke
from tests.conftest import now_ms
from yoke.http.durable_streams.messages import events_of
from yoke.store.durable_streams import CreateSpec, Guard
from yoke.store.sqlite.connection import SqliteDb
from yoke.store.sqlite.migrate import migrations

ON_EVENTS = re.compile(r"\b(FROM|JOIN|UPDATE|INTO)\s+(event_rows|event_blocks)\b", re.IGNORECASE)
SCAN = re.compile(r"SCAN (event_rows|event_blocks|b|e)\b")


def traced_statements(monkeypatch) -> list[str]:
    """Every statement the store's SQLite connections run from now on."""
    statements: list[str] = []
    connect = SqliteDb.connect

    def traced(self: SqliteDb) -> sqlite3.Connection:
        conn = connect(self)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(SqliteDb, "connect", traced)
    return statements


async def test_statements_on_events_use_an_index(tmp_path, monkeypatch) -> None:
    statements = traced_statements(monkeypatch)
    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        s = y.stream("/planned")
        await s.append_many([{"type": "e", "payload": i} for i in range(50)])
        await s.append({"type": "keyed", "idempotency_key": "k"})
        await s.append({"type": "keyed", "idempotency_key": "k"})  # the stored key answers
        await s.read(limit=5)
        await s.read(after=3, limit=100)
        await s.ack("reader", 10)
        await s.set_retention(max_events=20)
        await y.store.prune(now_ms())
        store = y.store
        created, _ = await store.protocol.create(
            "default", "/ds", "ds-1", now_ms(), CreateSpec(content_type="application/json")
        )
        events = events_of(b'[{"a":1},{"a":2}]', "application/json")
        await store.commit("default", "/ds", events, [0, 0], now_ms(), "x", [Guard(stream_id=created.stream_id)])
        await store.read_stored("default", "/ds", 0, 100, 1 << 20)
        assert await store.read_payloads("default", "/ds", 0, 100, 1 << 20, "ds.message") is not None
        forked, _ = await store.protocol.create(
            "default", "/fork", "ds-2", now_ms(), CreateSpec(content_type=None, fork_of="/ds", fork_offset=1)
        )
        assert (forked.head, forked.fork_offset) == (1, 1)
        assert [e.type for e in await store.subscriptions.events_of_types("default", "/planned", ["e"], 45, 9)] == ["e"] * 5
        await s.delete()

    migrations_sql = "\n".join(m.sql for m in migrations())
    on_events = [
        sql for sql in statements
        if ON_EVENTS.search(sql) and sql.strip() not in migrations_sql
        and not re.match(r"\s*INSERT INTO \w+ \([^)]*\) VALUES", sql)  # rows given, nothing found
    ]
    assert len(on_events) >= 8, on_events  # the workload above reached the events table
    check = sqlite3.connect(path)
    scans = {}
    for sql in on_events:
        plan = [row[3] for row in check.execute("EXPLAIN QUERY PLAN " + sql)]
        if any(SCAN.match(step) for step in plan):
            scans[sql] = plan
    assert not scans, scans


async def test_a_claim_costs_per_queued_group_not_per_owned_instance(tmp_path, monkeypatch) -> None:
    """A worker owning thousands of keyed instances, one of them with work:
    the claim pass probes the queued groups, not every instance it owns (it
    did, a statement per instance and pass, and a bench with 10,000 keys
    spent its writer thread there)."""
    from yoke.store.actors import InstanceInfo, Policy, QueueItem, new_instance_id

    statements = traced_statements(monkeypatch)
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        actors = y.store.actors
        owned = [
            (await actors.create_instance(
                InstanceInfo(new_instance_id(), "default", "a", f"k{i}", {}, None, None, "w1", now_ms())
            ))[0]
            for i in range(500)
        ]
        other = (await actors.create_instance(
            InstanceInfo(new_instance_id(), "default", "a", "theirs", {}, None, None, "w2", now_ms())
        ))[0]
        event = '{"type": "e"}'
        await actors.enqueue("default", [
            QueueItem(event, instance_id=owned[250].instance_id, group_id="g1"),
            QueueItem(event, instance_id=owned[250].instance_id, group_id="g2"),
            QueueItem(event, instance_id=other.instance_id),
        ], now_ms())
        statements.clear()
        claimed = await actors.claim("default", "w1", [Policy("a", 1, 30_000)], now_ms(), 10)
    assert sorted(r.group_id for r in claimed) == ["g1", "g2"]
    # Two groups of one owned instance and one of another worker's: a few
    # statements each (find it, its owner, its leases, its rows), not a
    # statement for each of the 500 instances.
    assert len(statements) <= 30, len(statements)


async def test_a_claim_stops_at_what_it_takes_and_the_groups_take_turns(tmp_path, monkeypatch) -> None:
    """500 keyed instances with work queued: a claim of 5 visits a handful
    of groups, not all 500 (every pass visited them all), and the next
    claims go on from where it stopped, so every instance gets its turn."""
    from yoke.store.actors import InstanceInfo, Policy, QueueItem, new_instance_id

    statements = traced_statements(monkeypatch)
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        actors = y.store.actors
        instances = [
            (await actors.create_instance(
                InstanceInfo(new_instance_id(), "default", "a", f"k{i}", {}, None, None, "w1", now_ms())
            ))[0]
            for i in range(500)
        ]
        await actors.enqueue(
            "default", [QueueItem('{"type": "e"}', instance_id=i.instance_id) for i in instances], now_ms()
        )
        policy = [Policy("a", 1, 30_000)]
        statements.clear()
        first = await actors.claim("default", "w1", policy, now_ms(), 5)
        assert len(first) == 5
        assert len(statements) <= 40, len(statements)
        claimed = {r.instance_id for r in first}
        for _ in range(99):
            claimed |= {r.instance_id for r in await actors.claim("default", "w1", policy, now_ms(), 5)}
        assert claimed == {i.instance_id for i in instances}
