"""What a claim pass costs on PostgreSQL, counted by the database itself
(``pg_stat_xact_user_tables``: the index and table scans the transaction
began, so far): with a thousand keyed instances queued, a pass that may take
five rows visits a handful of groups, not every queued group (yoke_claim did,
and with 10,000 keys the claims kept both cores busy)."""

from __future__ import annotations

import asyncpg
import orjson

from tests.conftest import now_ms
from yoke.config import Settings
from yoke.store import connect_store
from yoke.store.actors import InstanceInfo, QueueItem, new_instance_id

GROUPS = 1_000
SCANS = "SELECT coalesce(sum(idx_scan + seq_scan), 0) FROM pg_stat_xact_user_tables WHERE relname = 'actor_queue'"


async def scans_of(conn: asyncpg.Connection, claim: str, *args: object) -> tuple[int, int]:
    """(rows claimed, scans of actor_queue) for one call, rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(SCANS)
        rows = await conn.fetch(claim, *args)
        return len(rows), await conn.fetchval(SCANS) - before
    finally:
        await tx.rollback()


async def test_a_claim_pass_costs_what_it_takes_not_every_queued_group(pg_url: str, tenant: str) -> None:
    store = connect_store(Settings(database_url=pg_url))
    await store.start(on_wakeup=lambda tenant, path: None, on_resync=lambda: None)
    try:
        instances = [
            (await store.actors.create_instance(
                InstanceInfo(new_instance_id(), tenant, "a", f"k{i}", {}, None, None, "w1", now_ms())
            ))[0]
            for i in range(GROUPS)
        ]
        event = orjson.dumps({"type": "e"}).decode()
        await store.actors.enqueue(tenant, [QueueItem(event, instance_id=i.instance_id) for i in instances], now_ms())
    finally:
        await store.close()
    policy = (["a"], [1], [30_000], now_ms() + 1, 5, [], [], 0, 1)
    conn = await asyncpg.connect(pg_url)
    try:
        taken, turns = await scans_of(
            conn, "SELECT * FROM yoke_claim_in_turns($1, 'w1', $2, $3, $4, $5, $6, $7, $8, $9, $10, '', '')",
            tenant, *policy,
        )
        assert taken == 5
        # Five groups visited, each with a probe for it, its leases and its
        # rows; the round's other end probed once; and the claim itself.
        assert turns <= 30, turns
        taken, every_group = await scans_of(
            conn, "SELECT * FROM yoke_claim($1, 'w1', $2, $3, $4, $5, $6, $7, $8, $9, $10)", tenant, *policy,
        )
        assert taken == 5 and every_group >= GROUPS  # what the build before this one still calls
    finally:
        await conn.close()
