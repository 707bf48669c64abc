"""Fan-out: routing appended events into instance queues, on both backends."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import yoke
from yoke import App, Filter, InvalidFilter, UnknownActor

T = "acme"


def recording_app(**actor_options):
    app = App()
    seen: list[tuple[str, int, str]] = []

    @app.actor("rec", **actor_options)
    async def rec(ctx, event):
        seen.append((ctx.instance.key, event.offset, event.path))

    return app, seen


async def test_each_event_reaches_each_matching_instance_once(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["order.*"]))
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        for key in ("a", "b"):
            await y.instances(T).create("rec", key=key)
        s = y.stream("/orders/1", T)
        await s.append_many([{"type": "order.placed"}, {"type": "user.created"}, {"type": "order.paid"}])
        await s.append({"type": "order.tick", "ephemeral": True})  # never routed
        await y.wait_idle(timeout_s=10)
    assert sorted(seen) == [("a", 1, "/orders/1"), ("a", 3, "/orders/1"),
                            ("b", 1, "/orders/1"), ("b", 3, "/orders/1")]


async def test_two_executors_enqueue_each_event_at_most_once(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["job"]), concurrency=4)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y1, \
            yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y2:
        await y1.instances(T).create("rec", key="k")
        # Both executors race to fan out the same streams (y2 is woken by
        # NOTIFY on PostgreSQL and by its own appends on both).
        await asyncio.gather(
            *(y.stream(f"/s{i % 3}", T).append_many([{"type": "job"}] * 20)
              for i, y in enumerate([y1, y2] * 6))
        )
        await y1.wait_idle(timeout_s=20)
        await y2.wait_idle(timeout_s=20)
    counts = Counter((path, offset) for _, offset, path in seen)
    assert len(counts) == 240
    assert set(counts.values()) == {1}


async def test_fan_out_catches_up_from_the_cursor_after_a_restart(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["job"]))
    async with yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("rec", key="k")
        sent = await y.stream("/", T).append_many([{"type": "job"}] * 5)  # control plane: no fan-out
        assert (await y.instances(T).depth()).pending == 0
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.wait_idle(timeout_s=10)
    assert [o for _, o, _ in seen] == [s.offset for s in sent]


async def test_stream_globs_select_streams(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["*"], streams=["/orders/*"]))
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("rec", key="k")
        for path in ("/orders/1", "/orders/1/lines", "/users/1", "/orders/2"):
            await y.stream(path, T).append({"type": "x"})
        await y.wait_idle(timeout_s=10)
    assert sorted(p for _, _, p in seen) == ["/orders/1", "/orders/2"]


async def test_keyed_routing_creates_one_instance_per_key(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["order.*"], key="payload.order_id"))
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        s = y.stream("/", T)
        # Concurrent appends for the same keys: still one instance per key.
        await asyncio.gather(*(
            s.append({"type": "order.placed", "payload": {"order_id": n % 3}}) for n in range(30)
        ))
        await s.append({"type": "order.placed", "payload": {}})  # no key: routed nowhere
        await y.wait_idle(timeout_s=10)
        instances = await y.instances(T).list("rec")
        assert sorted(i.key for i in instances) == ["0", "1", "2"]
        assert all(i.filter is None for i in instances)
    assert Counter(k for k, _, _ in seen) == {"0": 10, "1": 10, "2": 10}


async def test_singleton_actor(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(filter=Filter(types=["tick"]), singleton=True)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/", T).append_many([{"type": "tick"}] * 3)
        await y.wait_idle(timeout_s=10)
        a = await y.instances(T).create("rec", key="ignored")
        b = await y.instances(T).create("rec")
        assert a.instance_id == b.instance_id and a.key == "singleton"
        assert len(await y.instances(T).list()) == 1
    assert len(seen) == 3


async def test_filter_from_config(fresh_url: str, tmp_path) -> None:
    app, seen = recording_app(
        filter_from_config=lambda c: {"types": ["work.assigned"], "where": f'payload.role = "{c["role"]}"'}
    )
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("rec", key="alice", config={"role": "coder"})
        await y.instances(T).create("rec", key="bob", config={"role": "tester"})
        o1, o2, o3 = (s.offset for s in await y.stream("/", T).append_many([
            {"type": "work.assigned", "payload": {"role": r}} for r in ("coder", "tester", "coder")
        ]))
        await y.wait_idle(timeout_s=10)
    assert sorted((k, o) for k, o, _ in seen) == [("alice", o1), ("alice", o3), ("bob", o2)]


async def test_instances_created_later_receive_later_events(fresh_url: str, tmp_path) -> None:
    """The index is rebuilt when instances appear (also in another process)."""
    app, seen = recording_app(filter=Filter(types=["job"]))
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y, \
            yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as control:
        await y.instances(T).create("rec", key="first")
        one = (await y.stream("/", T).append({"type": "job"})).offset
        await y.wait_idle(timeout_s=10)
        await control.instances(T).create("rec", key="second")  # another runtime
        two = (await y.stream("/", T).append({"type": "job"})).offset
        await y.wait_idle(timeout_s=10)
    assert sorted((k, o) for k, o, _ in seen) == [("first", one), ("first", two), ("second", two)]


async def test_bad_filters_and_actors_are_rejected_at_creation(fresh_url: str, tmp_path) -> None:
    app, _ = recording_app(filter_from_config=lambda c: {"types": ["x"], "where": c["where"]})
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        with pytest.raises(InvalidFilter) as info:
            await y.instances(T).create("rec", key="k", config={"where": "payload.("})
        assert "JSONata" in info.value.message
        with pytest.raises(InvalidFilter):
            await y.instances(T).create("rec", key="k2", filter={"types": ["x"], "where": "(("})
        with pytest.raises(UnknownActor):
            await y.instances(T).create("nobody", key="k")
        assert await y.instances(T).list() == []


async def test_instance_creation_is_idempotent_per_key(fresh_url: str, tmp_path) -> None:
    app, _ = recording_app(filter=Filter(types=["x"]))
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        made = await asyncio.gather(*(y.instances(T).create("rec", key="same") for _ in range(10)))
        assert len({m.instance_id for m in made}) == 1
        other_tenant = await y.instances("other").create("rec", key="same")
        assert other_tenant.instance_id != made[0].instance_id
        assert [i.key for i in await y.instances("other").list()] == ["same"]
        assert made[0].worker_id == y.worker_id  # new instances go to the creating worker
