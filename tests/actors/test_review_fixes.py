"""Regressions found in review: each would break a guarantee of the actor runtime."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter, InvalidFilter, PortalRequest
from tests.conftest import now_ms
from yoke.store.actors import Policy, QueueItem, Schedule

T = "acme"


async def test_keyed_and_singleton_instances_take_no_filter(fresh_url: str, tmp_path) -> None:
    app = App()
    runs: list[int] = []

    @app.actor("keyed", filter=Filter(types=["t"], key="payload.k"))
    async def keyed(ctx, event):
        runs.append(event.offset)

    @app.actor("one", filter=Filter(types=["u"]), singleton=True)
    async def one(ctx, event):
        runs.append(-event.offset)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        for actor in ("keyed", "one"):
            with pytest.raises(InvalidFilter):
                await y.instances(T).create(actor, key="a", filter={"types": ["t", "u"]})
    # A filter stored by a runtime without the application is ignored by fan-out.
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as control:
        await control.instances(T).create("keyed", key="a", filter={"types": ["t"]})
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        sent = await y.stream("/", T).append({"type": "t", "payload": {"k": "a"}})
        await y.wait_idle(timeout_s=10)
    assert runs == [sent.offset]  # once, by key


async def test_an_unroutable_key_and_a_failing_stream_hold_back_nothing(fresh_url: str, tmp_path) -> None:
    app = App()
    seen: list[str] = []

    @app.actor("keyed", filter=Filter(types=["t"], key="payload.k"))
    async def keyed(ctx, event):
        seen.append(event.path)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/a", T).append({"type": "t", "payload": {"k": "x" * 4000}})  # too long a key
        await y.stream("/b", T).append({"type": "t", "payload": {"k": "ok"}})
        await y.stream("/c", "other").append({"type": "t", "payload": {"k": "ok"}})
        await y.wait_idle(timeout_s=10)
    assert sorted(seen) == ["/b", "/c"]


async def test_a_refused_schedule_does_not_block_the_others(fresh_url: str, tmp_path) -> None:
    app = App()
    woke = asyncio.Event()

    @app.actor("timer")
    async def timer(ctx, event):
        woke.set()

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=0.02) as y:
        inst = await y.instances(T).create("timer", key="k")
        closed = y.stream("/closed", T)
        await closed.create()
        await closed.close()
        due = now_ms() - 1000
        await y.store.actors.upsert_schedule(
            Schedule(T, inst.instance_id, "a-to-closed", due, {"type": "x"}, stream="/closed", created_at=due)
        )
        await y.store.actors.upsert_schedule(
            Schedule(T, inst.instance_id, "b-wake", due + 1, {"type": "wake"}, created_at=due)
        )
        await asyncio.wait_for(woke.wait(), 10)
        await y.wait_idle(timeout_s=10)
        # The refused firing was skipped, and the one-shot schedule ended.
        assert await y.store.actors.schedules(T, inst.instance_id) == []


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_every_kind_of_write_is_persisted(fresh_url: str, tmp_path, storage: str) -> None:
    app = App()

    @app.actor("w", filter=Filter(types=["sql"]))
    async def w(ctx, event):
        await ctx.sqlite.exec(event.payload["sql"])

    statements = [
        "CREATE TABLE t (n INTEGER)",
        "INSERT INTO t VALUES (1), (2), (3)",
        "WITH old AS (SELECT 1) DELETE FROM t WHERE n = 1",
        "BEGIN", "INSERT INTO t VALUES (4)", "COMMIT",
    ]
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        inst = await y.instances(T).create("w", key="k")
        await y.stream("/", T).append_many([{"type": "sql", "payload": {"sql": q}} for q in statements])
        await y.wait_idle(timeout_s=10)
    async with yoke.open(fresh_url, data_dir=str(tmp_path), storage=storage) as y:
        db = y.state_databases().get(T, inst.instance_id)
        assert [r["n"] for r in await db.query("SELECT n FROM t ORDER BY n", ())] == [2, 3, 4]


async def test_an_instance_that_changed_hands_waits_for_the_old_leases(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        t0 = now_ms()
        for w in ("w1", "w2"):
            await actors.register_worker(w, {})
        inst = await y.instances(T).create("a", key="k")
        await actors.adopt_instances(T, "w1", 1)
        event = '{"id":"e","at":0,"type":"x"}'
        await actors.enqueue(T, [QueueItem(event, group_id="g1", instance_id=inst.instance_id),
                                 QueueItem(event, group_id="g2", instance_id=inst.instance_id)], t0)
        policy = [Policy("a", 1, 1000)]
        first = await actors.claim(T, "w1", policy, t0, 1)
        assert len(first) == 1
        # w1 is reaped while its run holds a lease; w2 adopts the instance.
        await actors.reap_workers("w2", -60_000)  # every other worker counts as silent
        await actors.release_instances(T, ["w1"])
        assert await actors.adopt_instances(T, "w2", 1) == 1
        assert await actors.claim(T, "w2", policy, t0 + 10, 10) == []  # the other group waits too
        later = await actors.claim(T, "w2", policy, t0 + 1001, 10)
        assert len(later) == 2  # the lease ended: both groups (the expired row again)


async def test_workers_adopt_only_instances_of_their_actors(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        await actors.register_worker("w", {})
        await y.instances(T).create("mine", key="k")
        other = await y.instances(T).create("theirs", key="k")
        assert await actors.adopt_instances(T, "w", 1, ["mine"]) == 1
        assert (await y.instances(T).get(other.instance_id)).worker_id is None


async def test_wait_idle_with_an_application_without_actors(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.portal("p", tenant=T)
    async def p(ctx, request):
        await ctx.append({"type": "hello"})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        from yoke.actors.portals import handle_request

        request = PortalRequest("POST", "/")
        assert await handle_request(y.actor_kernel, app, "p", request, worker_id=y.worker_id) == (204, None)
        await y.wait_idle(timeout_s=5)
