"""Worker membership: ownership, heartbeats, reaping and adoption (both backends)."""

from __future__ import annotations

import yoke
from yoke import App, Filter
from yoke.events import now_ms

T = "acme"


async def test_stale_workers_lose_their_instances_to_live_ones(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        t0 = now_ms()
        for w in ("w1", "w2"):
            await actors.register_worker(w, t0, {"pid": 1})
        made = [await y.instances(T).create("a", key=str(i)) for i in range(6)]
        assert all(m.worker_id is None for m in made)
        # Fair shares: each of two workers adopts at most half.
        assert await actors.adopt_instances(T, "w1", 2) == 3
        assert await actors.adopt_instances(T, "w1", 2) == 0
        assert await actors.adopt_instances(T, "w2", 2) == 3
        # w2 stops heartbeating; w1 keeps going.
        assert await actors.heartbeat("w1", t0 + 5000) is True
        gone = await actors.reap_workers(t0 + 1000)
        assert gone == ["w2"]
        assert await actors.heartbeat("w2", t0 + 6000) is False  # w2 learns it was reaped
        assert await actors.release_instances(T, gone) == 3
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
        await y.store.actors.register_worker("ghost", now_ms(), {})
        assert await y.store.actors.adopt_instances(T, "ghost", 1) == 0
        # No app in this runtime: the filter is given explicitly.
        inst = await y.instances(T).create("a", key="k", filter={"types": ["job"]})
        await y.store.actors.adopt_instances(T, "ghost", 1)
        await y.store.actors.reap_workers(now_ms() + 1)  # removed, instances still marked
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
