"""Lifecycle facts on the tenant's global stream: streams created and closed,
instances created, adopted and removed; never matched by '*', never copied;
on both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter
from yoke.subscriptions.receivers import from_dict

T = "acme"


async def facts(y: yoke.Runtime, prefix: str = "yoke.", tenant: str = T) -> list:
    return [e for e in await y.stream("/", tenant).read(limit=10_000) if e.type.startswith(prefix)]


async def test_stream_created_and_closed_are_facts_on_the_global_stream(fresh_url: str) -> None:
    async with yoke.open(fresh_url, executor=False) as y:
        first = await y.stream("/", T).append({"type": "hello"})
        assert first.offset == 1  # the global stream's own creation takes no offset
        orders = y.stream("/orders", T)
        sent = await orders.append({"type": "order.placed"})
        assert sent.offset == 1  # a stream's first event is still offset 1
        info = await orders.info()
        await y.stream("/defined", T).create(max_events=10)
        [created, defined] = await facts(y, "yoke.stream.created")
        assert created.payload == {"path": "/orders", "stream_id": info.stream_id, "created_at": info.created_at}
        assert defined.payload["path"] == "/defined"
        await orders.close()
        await orders.close()  # already closed: no second fact
        [closed] = await facts(y, "yoke.stream.closed")
        assert closed.payload == {"path": "/orders", "stream_id": info.stream_id}
        assert [e.type for e in await orders.read()] == ["order.placed"]  # its own log is untouched
        # Deleted: the fact outlives the stream's own log.
        gone = y.stream("/gone", T)
        await gone.append({"type": "x"})
        gone_id = (await gone.info()).stream_id
        await gone.delete()
        [deleted] = await facts(y, "yoke.stream.deleted")
        assert deleted.payload == {"path": "/gone", "stream_id": gone_id}
        await gone.append({"type": "again"})  # a new stream on the path: created again
        assert [e.payload["path"] for e in await facts(y, "yoke.stream.created")][-2:] == ["/gone", "/gone"]
        # The global stream closed still takes kernel facts (and records its own close).
        await y.stream("/", T).close()
        await y.stream("/later", T).create()
        assert [e.payload["path"] for e in await facts(y, "yoke.stream.")][-2:] == ["/", "/later"]


async def test_instances_created_removed_and_adopted_are_facts(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("coder", filter=Filter(types=["work"]))
    async def coder(ctx, event):
        await ctx.schedules.upsert("later", after_s=3600, event={"type": "tick"})

    @app.actor("order", filter=Filter(types=["order.placed"], key="payload.id"))
    async def order(ctx, event):
        return None

    # Created by a process without an executor: unowned until a worker adopts it.
    async with yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as y:
        unowned = await y.instances(T).create("coder", key="bob")
        assert unowned.worker_id is None
        [created] = await facts(y, "yoke.instance.")
        assert created.type == "yoke.instance.created"
        assert created.payload == {
            "instance_id": unowned.instance_id, "actor": "coder", "key": "bob", "parent_id": None,
            "worker_id": None,
        }
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        async with asyncio.timeout(20):
            while not [e for e in await facts(y, "yoke.instance.adopted")]:
                await asyncio.sleep(0.05)
        [adopted] = await facts(y, "yoke.instance.adopted")
        assert adopted.payload["instance_id"] == unowned.instance_id
        assert adopted.payload["worker_id"] == y.worker_id
        # A keyed instance created by fan-out is recorded too.
        await y.stream("/shop", T).append({"type": "order.placed", "payload": {"id": "A-1"}})
        await y.stream("/", T).append({"type": "work"})
        await y.wait_idle(timeout_s=20)
        keyed = await y.instances(T).find("order", "A-1")
        assert keyed is not None
        created = [e.payload["instance_id"] for e in await facts(y, "yoke.instance.created")]
        assert created == [unowned.instance_id, keyed.instance_id]
        assert (await y.store.actors.schedules(T, unowned.instance_id))
        removed = await y.instances(T).remove(unowned.instance_id)
        assert removed.instance_id == unowned.instance_id
        [fact] = await facts(y, "yoke.instance.removed")
        assert fact.payload["instance_id"] == unowned.instance_id and fact.payload["key"] == "bob"
        assert await y.store.actors.schedules(T, unowned.instance_id) == []
        with pytest.raises(yoke.InstanceNotFound):
            await y.instances(T).get(unowned.instance_id)
        with pytest.raises(yoke.InstanceNotFound):
            await y.instances(T).remove(unowned.instance_id)
        # Removed, its events no longer reach it; created again, it starts afresh.
        again = await y.instances(T).create("coder", key="bob")
        assert again.instance_id != unowned.instance_id


async def test_lifecycle_facts_are_named_never_matched_by_star_and_never_copied(
    fresh_url: str, tmp_path
) -> None:
    app = App()
    everything: list[str] = []
    lifecycle: list[str] = []

    @app.actor("all", filter=Filter(types=["*"]))
    async def all_(ctx, event):
        everything.append(event.type)
        if event.type == "spawn":  # would feed itself if '*' matched instance facts
            await ctx.instances.create("sink")

    @app.actor("watcher", filter=Filter(types=["yoke.instance.*", "yoke.stream.closed"]))
    async def watcher(ctx, event):
        lifecycle.append(event.type)

    @app.actor("sink")
    async def sink(ctx, event):
        return None

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), subscription_sweep_s=0.05) as y:
        root = y.stream("/", T)
        await root.subscribe("mirror", yoke.copy_to_stream("/mirror"))
        await y.instances(T).create("all", key="a")
        await y.instances(T).create("watcher", key="w")
        await root.append({"type": "spawn"})
        await y.stream("/other", T).create()
        await y.stream("/other", T).close()
        await y.wait_idle(timeout_s=20)
        await root.wait_until_processed("mirror", (await root.info()).head, timeout_s=20)
        await y.wait_idle(timeout_s=20)
        assert not any(t.startswith(("yoke.instance.", "yoke.stream.")) for t in everything)
        assert "spawn" in everything
        assert "yoke.instance.created" in lifecycle  # sink's, at least (created after the watcher)
        assert lifecycle.count("yoke.stream.closed") == 1
        mirrored = [e.type for e in await y.stream("/mirror", T).read()]
        assert "spawn" in mirrored
        assert not any(t.startswith(("yoke.instance.", "yoke.stream.")) for t in mirrored)


async def test_a_new_streams_fact_reaches_its_actors_without_waiting_for_the_sweep(fresh_url: str) -> None:
    """A stream made by an append, by create() or by a subscription on it
    announces its yoke.stream.created fact on '/' at once: with the fan-out's
    periodic sweep a minute away, an actor watching the facts has them all."""
    app = App()
    seen: list[str] = []

    @app.actor("watcher", filter=Filter(types=["yoke.stream.created"]), singleton=True)
    async def watcher(ctx, event):  # noqa: ANN001, ANN202
        seen.append(event.payload["path"])

    async with yoke.open(fresh_url, app=app, scheduler_sweep_s=60) as y:
        await y.stream("/by-append", T).append({"type": "x"})
        await y.stream("/by-create", T).create()
        await y.stream("/by-subscription", T).subscribe("copy", from_dict({"kind": "copy", "target": "/elsewhere"}))
        await y.wait_idle(timeout_s=10)
        assert sorted(seen) == ["/by-append", "/by-create", "/by-subscription"]
