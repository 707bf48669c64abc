"""The actor store on both drivers: instances, the queue's claim, complete,
fail and dead letters, workers' heartbeats and reaping, schedules."""

from __future__ import annotations

import orjson

from tests.conftest import now_ms
from yoke.store.actors import InstanceInfo, Policy, QueueItem, Schedule, new_instance_id

from .conftest import new_id

ACTOR = "counter"
LEASE_MS = 30_000


async def instance(store, tenant, key="k", worker_id=None) -> InstanceInfo:
    info, created = await store.actors.create_instance(
        InstanceInfo(new_instance_id(), tenant, ACTOR, key, {"c": 1}, None, None, worker_id, now_ms())
    )
    assert created
    return info


def item(inst: InstanceInfo, n: int, **fields) -> QueueItem:
    return QueueItem(orjson.dumps({"type": "e", "payload": {"n": n}}).decode(), instance_id=inst.instance_id, **fields)


async def claim(store, tenant, worker, limit=10, concurrency=1, now=None, done=()):
    return await store.actors.claim(
        tenant, worker, [Policy(ACTOR, concurrency, LEASE_MS)], now if now is not None else now_ms(), limit, done,
    )


async def test_instances(store, tenant):
    a = await instance(store, tenant, "a")
    same, created = await store.actors.create_instance(
        InstanceInfo(new_instance_id(), tenant, ACTOR, "a", {}, None, None, None, now_ms())
    )
    assert not created and same.instance_id == a.instance_id
    b = await instance(store, tenant, "b")
    assert (await store.actors.get_instance(tenant, a.instance_id)).config == {"c": 1}
    assert (await store.actors.find_instance(tenant, ACTOR, "b")).instance_id == b.instance_id
    assert {i.instance_id for i in await store.actors.get_instances(tenant, [a.instance_id, "inst_none"])} == {a.instance_id}
    listed = await store.actors.list_instances(tenant, ACTOR, 10, None)
    assert [i.instance_id for i in listed] == sorted([a.instance_id, b.instance_id])
    assert tenant in await store.actors.tenants()
    removed = await store.actors.remove_instance(tenant, a.instance_id)
    assert removed is not None and removed.instance_id == a.instance_id
    assert await store.actors.get_instance(tenant, a.instance_id) is None
    assert await store.actors.remove_instance(tenant, a.instance_id) is None
    facts = (await store.read(tenant, "/", 0, 100)).events
    assert "yoke.instance.removed" in [e.type for e in facts]


async def test_claim_complete_in_priority_then_enqueue_order(store, tenant):
    worker = new_id("w")
    inst = await instance(store, tenant, worker_id=worker)
    await store.actors.enqueue(tenant, [item(inst, 0), item(inst, 1, priority=5), item(inst, 2)], now_ms())
    assert (await store.actors.queue_depth(tenant, inst.instance_id)).pending == 3
    (first,) = await claim(store, tenant, worker)
    assert (first.event["payload"], first.status, first.attempts, first.worker_id) == ({"n": 1}, "processing", 1, worker)
    # concurrency 1 per (instance, group): nothing more while it is held
    assert await claim(store, tenant, worker) == []
    (second,) = await claim(store, tenant, worker, done=[(first.qid, first.attempts)])
    assert second.event["payload"] == {"n": 0}
    await store.actors.complete(tenant, [(second.qid, second.attempts)])
    (third,) = await claim(store, tenant, worker)
    assert third.event["payload"] == {"n": 2}
    depth = await store.actors.queue_depth(tenant, inst.instance_id)
    assert (depth.pending, depth.processing, depth.dead) == (0, 1, 0)


async def test_claims_only_the_owners_instances_and_groups_run_apart(store, tenant):
    worker = new_id("w")
    mine = await instance(store, tenant, "mine", worker_id=worker)
    theirs = await instance(store, tenant, "theirs", worker_id=new_id("w"))
    await store.actors.enqueue(tenant, [item(mine, 0, group_id="a"), item(mine, 1, group_id="b"), item(theirs, 2)], now_ms())
    claimed = await claim(store, tenant, worker)
    assert sorted(r.event["payload"]["n"] for r in claimed) == [0, 1]


async def test_a_claim_stops_at_its_limit_and_the_groups_take_turns(store, tenant):
    """Rows are claimed in turns across (instance, group)s: a pass takes
    what it may from the groups after where the last pass stopped, round
    the end and back, so with more queued groups than a pass may take,
    every group gets its turn and none waits for the groups before it to
    drain. An instance another worker owns is passed over, all its groups."""
    worker = new_id("w")
    mine = [await instance(store, tenant, f"k{i:02}", worker_id=worker) for i in range(30)]
    theirs = await instance(store, tenant, "theirs", worker_id=new_id("w"))
    # Three rows a group, enqueued group after group: by enqueue order alone
    # the first groups would be claimed again and again.
    await store.actors.enqueue(tenant, [
        *(item(inst, n, group_id=group) for inst in mine for group in ("a", "b") for n in range(3)),
        *(item(theirs, n, group_id=group) for group in ("a", "b") for n in range(3)),
    ], now_ms())
    done: list[tuple[int, int]] = []

    async def turn() -> set[tuple[str, str | None]]:
        nonlocal done
        rows = await claim(store, tenant, worker, limit=5, done=done)
        assert len(rows) == 5
        done = [(r.qid, r.attempts) for r in rows]  # completed by the next pass
        return {(r.instance_id, r.group_id) for r in rows}

    first_round = [await turn() for _ in range(12)]  # 60 groups of mine, 5 a pass
    seen = set().union(*first_round)
    assert len(seen) == 60 and {i for i, _ in seen} == {inst.instance_id for inst in mine}
    # Round the end and back: the next passes begin again at the first groups.
    assert [await turn() for _ in range(12)] == first_round


async def test_an_expired_lease_is_claimed_again(store, tenant):
    worker = new_id("w")
    inst = await instance(store, tenant, worker_id=worker)
    await store.actors.enqueue(tenant, [item(inst, 0)], now_ms())
    (row,) = await claim(store, tenant, worker)
    (again,) = await claim(store, tenant, worker, now=now_ms() + LEASE_MS + 1)
    assert (again.qid, again.attempts) == (row.qid, 2)
    # the first claim's completion is late: the row stays
    await store.actors.complete(tenant, [(row.qid, row.attempts)])
    assert (await store.actors.queue_depth(tenant, inst.instance_id)).processing == 1


async def test_fail_retries_then_dead_letters_and_redrive(store, tenant):
    worker = new_id("w")
    inst = await instance(store, tenant, worker_id=worker)
    await store.actors.enqueue(tenant, [item(inst, 0)], now_ms())
    (row,) = await claim(store, tenant, worker)
    retry_at = now_ms() + 60_000
    await store.actors.fail(tenant, row.qid, row.attempts, retry_at=retry_at, error="boom", traceback="tb")
    (pending,) = await store.actors.queue_rows(tenant, inst.instance_id, "pending", 10)
    assert (pending.attempts, pending.available_at, pending.last_error) == (1, retry_at, "boom")
    assert pending.actor == ACTOR  # was '' (the instance's actor, joined)
    assert await claim(store, tenant, worker) == []  # not due yet
    (row,) = await claim(store, tenant, worker, now=retry_at)
    assert row.attempts == 2
    await store.actors.fail(tenant, row.qid, row.attempts, retry_at=None, error="again", traceback="tb2")
    (dead,) = await store.actors.dead_letters(tenant, instance_id=inst.instance_id)
    assert (dead.qid, dead.status, dead.last_error, dead.actor) == (row.qid, "dead", "again", ACTOR)
    assert await store.actors.dead_by_instance(tenant, 10) == [(inst.instance_id, 1)]
    assert len(await store.actors.dead_letter_times(tenant, 10)) == 1
    assert await store.actors.redrive(tenant, inst.instance_id, None, now_ms()) == 1
    (back,) = await store.actors.queue_rows(tenant, inst.instance_id, None, 10)
    assert (back.status, back.attempts) == ("pending", 0)
    (row,) = await claim(store, tenant, worker)
    await store.actors.fail(tenant, row.qid, row.attempts, retry_at=None, error="x", traceback="")
    assert await store.actors.drop_dead(tenant, inst.instance_id, [row.qid]) == 1
    assert await store.actors.queue_depth(tenant, inst.instance_id) == type(await store.actors.queue_depth(tenant, None))()


async def test_unfinished_rows_most_attempted_first_dead_left_out(store, tenant):
    worker = new_id("w")
    inst = await instance(store, tenant, worker_id=worker)
    other = await instance(store, tenant, "other", worker_id=worker)
    await store.actors.enqueue(tenant, [item(inst, 0), item(inst, 1), item(other, 2)], now_ms())
    rows = await claim(store, tenant, worker)
    tried = next(r for r in rows if r.instance_id == inst.instance_id)
    await store.actors.fail(tenant, tried.qid, tried.attempts, retry_at=now_ms() + 60_000, error="boom", traceback="")
    unfinished = await store.actors.unfinished_rows(tenant, [ACTOR], 10)
    assert len(unfinished) == 3 and unfinished[0].qid == tried.qid  # the most attempted first
    assert (unfinished[0].attempts, unfinished[0].last_error, unfinished[0].actor) == (1, "boom", ACTOR)
    assert {r.status for r in unfinished[1:]} <= {"pending", "processing"}
    assert len(await store.actors.unfinished_rows(tenant, [ACTOR], 2)) == 2
    assert await store.actors.unfinished_rows(tenant, ["another_actor"], 10) == []
    (row,) = [r for r in await claim(store, tenant, worker, now=now_ms() + 60_000) if r.qid == tried.qid]
    await store.actors.fail(tenant, row.qid, row.attempts, retry_at=None, error="dead", traceback="")
    assert tried.qid not in {r.qid for r in await store.actors.unfinished_rows(tenant, [ACTOR], 10)}


async def test_workers_heartbeat_reap_and_hand_over(store, tenant):
    gone, alive = new_id("w"), new_id("w")
    await store.actors.register_worker(gone, {"host": "a"})
    await store.actors.register_worker(alive, {"host": "b"})
    assert {gone, alive} <= set(await store.actors.live_workers())
    assert await store.actors.heartbeat(gone)
    assert gone not in [r.worker_id for r in await store.actors.reap_workers(alive, 3_600_000)]
    inst = await instance(store, tenant, worker_id=gone)
    # stale_ms -1: every heartbeat is older than that
    reaped = {r.worker_id: r for r in await store.actors.reap_workers(alive, -1)}
    assert gone in reaped and alive not in reaped and reaped[gone].info == {"host": "a"}
    assert not await store.actors.heartbeat(gone)
    assert await store.actors.release_instances(tenant, [gone]) == 1
    assert await store.actors.adopt_instances(tenant, alive, 1) == 1
    assert (await store.actors.get_instance(tenant, inst.instance_id)).worker_id == alive
    await store.actors.unregister_worker(alive)
    assert alive not in await store.actors.live_workers()


async def test_the_agenda_counts_what_is_runnable_now_and_finds_the_next_due_time(store, tenant):
    """What a test's virtual clock reads (yoke.testing): rows processing or
    pending and due, schedules due and the fan-out's backlog are runnable;
    the next due time is the earliest later retry or schedule."""
    worker = new_id("w")
    inst = await instance(store, tenant, worker_id=worker)
    now = now_ms()
    base = await store.actors.agenda(tenant, now)  # the instance's creation fact waits for fan-out
    assert base.next_due is None
    await store.actors.enqueue(tenant, [item(inst, 0), item(inst, 1, available_at=now + 5_000)], now)
    await store.actors.upsert_schedule(Schedule(tenant, inst.instance_id, "s", now + 3_000, {"type": "s"}, created_at=now))
    agenda = await store.actors.agenda(tenant, now)
    assert (agenda.runnable, agenda.next_due) == (base.runnable + 1, now + 3_000)
    (row,) = await claim(store, tenant, worker, now=now)
    assert (await store.actors.agenda(tenant, now)).runnable == base.runnable + 1  # processing
    await store.actors.complete(tenant, [(row.qid, row.attempts)])
    assert await store.actors.agenda(tenant, now) == type(agenda)(base.runnable, now + 3_000)
    # At the schedule's time it is runnable; then the retried row is next.
    assert await store.actors.agenda(tenant, now + 3_000) == type(agenda)(base.runnable + 1, now + 5_000)
    assert await store.actors.agenda(tenant, now + 5_000) == type(agenda)(base.runnable + 2, None)
    # Another tenant's rows are not this one's.
    other = await store.actors.agenda(tenant + "x", now + 5_000)
    assert (other.runnable, other.next_due) == (0, None)


async def test_schedules_upsert_fire_and_cancel(store, tenant):
    inst = await instance(store, tenant)
    now = now_ms()
    due = Schedule(tenant, inst.instance_id, "tick", now - 10, {"type": "tick"}, cron=None, created_at=now)
    assert await store.actors.upsert_schedule(due) == now - 10
    later = Schedule(tenant, inst.instance_id, "later", now + 60_000, {"type": "later"}, created_at=now)
    await store.actors.upsert_schedule(later)
    moved = Schedule(tenant, inst.instance_id, "later", now + 120_000, {"type": "moved"}, created_at=now)
    await store.actors.upsert_schedule(moved)  # the same name: replaced
    by_name = {s.name: s for s in await store.actors.schedules(tenant, inst.instance_id)}
    assert (by_name["later"].due_at, by_name["later"].event) == (now + 120_000, {"type": "moved"})
    (fire,) = await store.actors.due_schedules(tenant, now, 10)
    assert fire.name == "tick"
    assert await store.actors.fire_schedule(fire, now + 1000, item(inst, 7), now)
    assert not await store.actors.fire_schedule(fire, None, item(inst, 8), now)  # fired already
    assert (await store.actors.queue_depth(tenant, inst.instance_id)).pending == 1
    assert {s.name: s.due_at for s in await store.actors.schedules(tenant, inst.instance_id)}["tick"] == now + 1000
    assert await store.actors.cancel_schedule(tenant, inst.instance_id, "tick")
    assert not await store.actors.cancel_schedule(tenant, inst.instance_id, "tick")
    assert [s.name for s in await store.actors.schedules(tenant, inst.instance_id)] == ["later"]


async def test_state_images(store, tenant):
    inst = await instance(store, tenant)
    assert await store.actors.load_state(tenant, inst.instance_id) is None
    await store.actors.save_state(tenant, inst.instance_id, b"image", now_ms())
    assert await store.actors.load_state(tenant, inst.instance_id) == b"image"
    await store.actors.save_state(tenant, inst.instance_id, b"image 2", now_ms())
    assert await store.actors.load_state(tenant, inst.instance_id) == b"image 2"
    # Another tenant neither reads the image nor overwrites it: its write
    # is a row of its own.
    other = new_id("t")
    assert await store.actors.load_state(other, inst.instance_id) is None
    await store.actors.save_state(other, inst.instance_id, b"theirs", now_ms())
    assert await store.actors.load_state(tenant, inst.instance_id) == b"image 2"
    assert await store.actors.load_state(other, inst.instance_id) == b"theirs"
