"""Worker membership: ownership, heartbeats, reaping and adoption (both backends)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import yoke
from yoke import App, Filter
from yoke.actors.membership import Membership
from yoke.streams.wakeups import WakeupHub

from tests.conftest import empty_database

T = "acme"


async def test_stale_workers_lose_their_instances_to_live_ones(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        for w in ("w1", "w2"):
            await actors.register_worker(w, {"pid": 1})
        made = [await y.instances(T).create("a", key=str(i)) for i in range(6)]
        assert all(m.worker_id is None for m in made)
        # Fair shares: each of two workers adopts at most half.
        assert await actors.adopt_instances(T, "w1", 2) == 3
        assert await actors.adopt_instances(T, "w1", 2) == 0
        assert await actors.adopt_instances(T, "w2", 2) == 3
        # w2 falls silent; w1 keeps going and reaps it (a negative stale_ms:
        # every heartbeat counts as old, w1 is never its own victim).
        assert await actors.heartbeat("w1") is True
        gone = await actors.reap_workers("w1", -60_000)
        assert [(g.worker_id, g.info) for g in gone] == [("w2", {"pid": 1})]
        assert await actors.heartbeat("w2") is False  # w2 learns it was reaped
        assert await actors.release_instances(T, ["w2"]) == 3
        assert await actors.adopt_instances(T, "w1", 1) == 3
        owners = {i.worker_id for i in await y.instances(T).list()}
        assert owners == {"w1"}
        await actors.unregister_worker("w1")
        assert {i.worker_id for i in await y.instances(T).list()} == {None}
        assert await actors.live_workers() == []


async def test_instances_of_an_unregistered_owner_are_adopted(fresh_url: str, tmp_path) -> None:
    """An owner that vanished without being reaped here (reaped by another
    process) is treated as gone."""
    app = App()
    seen: list[str] = []

    @app.actor("a", filter=Filter(types=["job"]))
    async def a(ctx, event):
        seen.append(ctx.instance.key)

    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        await y.store.actors.register_worker("ghost", {})
        assert await y.store.actors.adopt_instances(T, "ghost", 1) == 0
        # No app in this runtime: the filter is given explicitly.
        inst = await y.instances(T).create("a", key="k", filter={"types": ["job"]})
        await y.store.actors.adopt_instances(T, "ghost", 1)
        await y.store.actors.reap_workers("nobody", -60_000)  # removed, instances still marked
        assert (await y.instances(T).get(inst.instance_id)).worker_id == "ghost"
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/", T).append({"type": "job"})
        await y.wait_idle(timeout_s=10)
        assert (await y.instances(T).get(inst.instance_id)).worker_id == y.worker_id
    assert seen == ["k"]


async def test_a_closed_executor_leaves_cleanly(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("a", filter=Filter(types=["job"]))
    async def a(ctx, event):
        pass

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        worker = y.worker_id
        assert worker in await y.store.actors.live_workers()
        inst = await y.instances(T).create("a", key="k")
        assert inst.worker_id == worker
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        assert worker not in await y.store.actors.live_workers()
        assert (await y.instances(T).get(inst.instance_id)).worker_id is None


class _SlowFirstAdoption:
    """The real actor store, but the adoption pass waits for ``release`` and
    each heartbeat is signalled: a first pass over many tenants on a loaded
    machine, made to last as long as the test needs."""

    def __init__(self, actors) -> None:
        self._actors = actors
        self.release = asyncio.Event()
        self.beats = 0
        self.beaten = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._actors, name)

    async def tenants(self):
        await self.release.wait()
        return await self._actors.tenants()

    async def heartbeat(self, worker_id: str) -> bool:
        alive = await self._actors.heartbeat(worker_id)
        self.beats += 1
        if self.beats >= 3:
            self.beaten.set()
        return alive


async def test_a_joining_worker_heartbeats_during_its_first_adoption(fresh_url: str, tmp_path) -> None:
    """The first adoption pass (and the host warm-up after it) can outlast
    worker_stale_s; a worker that only began to beat after them was reaped
    by its peers before it started."""
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = _SlowFirstAdoption(y.store.actors)
        member = Membership(
            lambda: actors, WakeupHub(), "joining", heartbeat_s=0.05, stale_s=0.5,
            on_adopted=lambda tenant: None, on_evicted=lambda: None, actors=["a"],
        )
        joining = asyncio.create_task(member.register())
        await asyncio.wait_for(actors.beaten.wait(), timeout=10)  # beats while the pass hangs
        assert not joining.done()
        actors.release.set()
        await joining
        assert await y.store.actors.live_workers() == ["joining"]
        await member.leave()  # stops the beat, then leaves
        beats = actors.beats
        assert await y.store.actors.live_workers() == []
        await asyncio.sleep(0.2)  # four heartbeat periods: a beat left running would rejoin
        assert actors.beats == beats
        assert await y.store.actors.live_workers() == []


async def test_a_worker_over_its_share_gives_up_the_excess_but_never_a_running_instance(
    fresh_url: str, tmp_path
) -> None:
    """Workers share the instances: w1 had all six, w2 joins; w1 gives up
    what is beyond ceil(6 / 2), keeping the instance whose row is running,
    and w2 adopts what w1 gave up."""
    from yoke.store.actors import Policy, QueueItem

    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        await actors.register_worker("w1", {})
        made = [await y.instances(T).create("a", key=str(i)) for i in range(6)]
        assert await actors.adopt_instances(T, "w1", 1) == 6
        assert await actors.release_excess(T, "w1", 1) == []  # alone: its share is all
        # A row of the instance released first (the highest id) is running on w1.
        busy = max(m.instance_id for m in made)
        await actors.enqueue(T, [QueueItem('{"type": "job"}', instance_id=busy)], 0)
        claimed = await actors.claim(T, "w1", [Policy("a", 1, 60_000)], 1, 10)
        assert [r.instance_id for r in claimed] == [busy]
        await actors.register_worker("w2", {})
        released = await actors.release_excess(T, "w1", 2)
        assert len(released) == 3 and busy not in released
        assert await actors.release_excess(T, "w1", 2) == []  # at its share now
        assert await actors.adopt_instances(T, "w2", 2) == 3
        owners = {i.instance_id: i.worker_id for i in await y.instances(T).list()}
        assert sorted(owners.values()) == ["w1"] * 3 + ["w2"] * 3
        assert owners[busy] == "w1" and all(owners[r] == "w2" for r in released)

        # A third worker while all three of w1's are busy: its excess (one,
        # the highest id) drains: its next row is not claimed, and it goes
        # once idle, its queued row with it.
        policy = [Policy("a", 1, 60_000)]
        await actors.register_worker("w3", {})
        ones = sorted(i for i, w in owners.items() if w == "w1")
        await actors.enqueue(T, [QueueItem('{"type": "job"}', instance_id=i) for i in ones if i != busy], 0)
        running = claimed + await actors.claim(T, "w1", policy, 2, 10)
        assert sorted(r.instance_id for r in running) == ones
        assert await actors.release_excess(T, "w1", 3) == []  # all busy: one drains
        await actors.enqueue(T, [QueueItem('{"type": "job"}', instance_id=i) for i in ones], 0)
        running = await actors.claim(T, "w1", policy, 3, 10, done=[(r.qid, r.attempts) for r in running])
        assert sorted(r.instance_id for r in running) == ones[:2]  # not the draining one
        assert await actors.release_excess(T, "w1", 3) == [ones[2]]
        assert await actors.adopt_instances(T, "w3", 3) == 1
        assert [r.instance_id for r in await actors.claim(T, "w3", policy, 4, 10)] == [ones[2]]

        # Workers leave before a draining instance goes idle: it stays, claimable again.
        assert await actors.release_excess(T, "w1", 6) == []  # a share of one, both busy: one drains
        await actors.enqueue(T, [QueueItem('{"type": "job"}', instance_id=i) for i in ones[:2]], 0)
        assert await actors.release_excess(T, "w1", 3) == []  # at its share again
        done = [(r.qid, r.attempts) for r in running]
        again = await actors.claim(T, "w1", policy, 5, 10, done=done)
        assert sorted(r.instance_id for r in again) == ones[:2]  # the drained one too


@pytest.mark.parametrize("fresh_url", ["postgres"], indirect=True)
async def test_a_release_waits_for_the_workers_claim_under_way(fresh_url: str, tmp_path) -> None:
    """PostgreSQL: a claim of w1 still open when w1 releases instances. The
    release waits for it (advisory lock), then sees the row it took and
    keeps that instance; without the wait, w2 could adopt the instance and
    run it while w1 runs the claimed row."""
    from yoke.store.actors import QueueItem

    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        await actors.register_worker("w1", {})
        made = [await y.instances(T).create("a", key=str(i)) for i in range(2)]
        await actors.adopt_instances(T, "w1", 1)
        busy = max(m.instance_id for m in made)  # the one a release would give up first
        await actors.enqueue(T, [QueueItem('{"type": "job"}', instance_id=busy)], 0)
        await actors.register_worker("w2", {})
        claiming = await asyncpg.connect(fresh_url)
        try:
            tx = claiming.transaction()
            await tx.start()
            taken = await claiming.fetch(
                "SELECT * FROM yoke_claim($1, 'w1', ARRAY['a'], ARRAY[1], ARRAY[60000::bigint], 1, 10,"
                " '{}'::bigint[], '{}'::int[], 0, 1)", T,
            )
            assert [r["o_instance"] for r in taken] == [busy]
            release = asyncio.create_task(actors.release_excess(T, "w1", 2))
            async with asyncio.timeout(10):  # the release queues behind the claim's lock
                while not await claiming.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ):
                    await asyncio.sleep(0.01)
            assert not release.done()
            await tx.commit()
            released = await release
        finally:
            await claiming.close()
        assert released == [min(m.instance_id for m in made)]  # the running one stays with w1


async def test_a_claim_in_flight_when_the_worker_stops_is_seen_through(pg_actors_db: str, tmp_path) -> None:
    """A stop that begins while a claim is on its way to the store: the rows
    that claim leases start running after the stop began, and the stop must
    wait for them (or cancel them, handing their rows back), never return
    with them still running under a closing runtime and their rows leased.
    The claim is held on its advisory lock from outside to place it there;
    one claim loop, so that the claim held is the one job 2's instance is
    claimed by (with shards, another loop's claim could be the one held)."""
    from yoke.store.postgres.actors import CLAIM_LOCK

    await empty_database(pg_actors_db)
    app = App()
    started = {"1": asyncio.Event(), "2": asyncio.Event()}
    gate1 = asyncio.Event()
    cancelled: list[str] = []

    @app.actor("a", filter=Filter(types=["job"], key="payload.key"), timeout_s=60)
    async def a(ctx, event):
        started[ctx.instance.key].set()
        try:
            if ctx.instance.key == "1":
                await gate1.wait()
            else:
                await asyncio.Event().wait()  # until the stop's timeout cancels it
        except asyncio.CancelledError:
            cancelled.append(ctx.instance.key)
            raise

    admin = await asyncpg.connect(pg_actors_db)
    try:
        async with yoke.open(
            pg_actors_db, app=app, data_dir=str(tmp_path), shutdown_timeout_s=1.0, claim_shards=1
        ) as y:
            await y.stream("/", T).append({"type": "job", "payload": {"key": "1"}})
            async with asyncio.timeout(20):
                await started["1"].wait()
            await admin.execute("SELECT pg_advisory_lock($1, hashtext($2))", CLAIM_LOCK, y.worker_id)
            await y.stream("/", T).append({"type": "job", "payload": {"key": "2"}})
            # Job 2 enqueued (fan-out runs after the append, and stops with the
            # worker) and a claim waiting on the lock: the claim takes the lock
            # first, so once let through it sees job 2 whenever it began.
            async with asyncio.timeout(20):
                while not (
                    await admin.fetchval("SELECT count(*) FROM actor_queue") == 2
                    and await admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%yoke_complete_and_claim%' AND datname = current_database()"
                    )
                ):
                    await asyncio.sleep(0.02)
            scheduler = y.executor.scheduler
            closing = asyncio.create_task(y.close())
            async with asyncio.timeout(20):
                while not scheduler.stopping:
                    await asyncio.sleep(0.01)
            await admin.execute("SELECT pg_advisory_unlock($1, hashtext($2))", CLAIM_LOCK, y.worker_id)
            async with asyncio.timeout(20):
                await started["2"].wait()
            gate1.set()
            await closing
        # Run 2 started after the stop began; the stop saw it and cancelled it
        # at its timeout, so its row is pending again, not left leased.
        assert cancelled == ["2"]
        rows = await admin.fetch("SELECT status FROM actor_queue ORDER BY qid")
        assert [r["status"] for r in rows] == ["pending"], rows  # run 1's row completed
    finally:
        await admin.close()
