"""Durable schedules, on both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter, InvalidSchedule
from tests.conftest import now_ms
from yoke.store.actors import Schedule

T = "acme"


def timer_app():
    app = App()
    fired: list[tuple[str, object, object]] = []
    arrived = asyncio.Event()

    @app.actor("timer", filter=Filter(types=["start"]))
    async def timer(ctx, event):
        if event.type == "start":
            await ctx.schedules.upsert("later", after_s=0.05, event={"type": "wake", "payload": {"n": 1}})
            await ctx.schedules.upsert(
                "to-stream", after_s=0.05, event={"type": "reminder"}, stream="/reminders"
            )
            await ctx.schedules.upsert("never", after_s=3600, event={"type": "wake"})
            assert await ctx.schedules.cancel("never") is True
            assert await ctx.schedules.cancel("never") is False
        else:
            fired.append((event.type, event.path, event.source))
            arrived.set()

    return app, fired, arrived


async def test_a_due_schedule_enqueues_to_its_instance_or_appends_to_a_stream(fresh_url: str, tmp_path) -> None:
    app, fired, arrived = timer_app()
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=0.02) as y:
        inst = await y.instances(T).create("timer", key="k")
        await y.stream("/", T).append({"type": "start"})
        await asyncio.wait_for(arrived.wait(), 10)
        await asyncio.wait_for(_until_idle(y, inst), 10)  # one-shot schedules are removed
        reminders = await y.stream("/reminders", T).read(after=0)
        assert [(e.type, e.source) for e in reminders] == [
            ("reminder", {"instance": inst.instance_id, "schedule": "to-stream"})
        ]
    assert fired == [("wake", None, {"instance": inst.instance_id, "schedule": "later"})]


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def test_a_cron_schedule_missed_while_down_fires_once_on_restart(fresh_url: str, tmp_path) -> None:
    app = App()
    wakes: list[int] = []

    @app.actor("cron", filter=Filter(types=["none"]))
    async def cron(ctx, event):
        wakes.append(event.at)

    async with yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("cron", key="k")
        # Due an hour ago, every minute since: 60 firings were missed.
        await y.store.actors.upsert_schedule(
            Schedule(T, inst.instance_id, "every-minute", now_ms() - 3_600_000,
                     {"type": "tick"}, cron="* * * * *", created_at=now_ms())
        )
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=0.02) as y:
        await asyncio.wait_for(_until(lambda: len(wakes) == 1), 10)
        await y.wait_idle(timeout_s=10)
        (schedule,) = await y.store.actors.schedules(T, inst.instance_id)
        assert now_ms() < schedule.due_at <= now_ms() + 60_000  # the next minute, not the past
        assert len(wakes) == 1


async def test_a_schedule_fires_once_across_executors(fresh_url: str, tmp_path) -> None:
    app = App()
    wakes: list[str] = []

    @app.actor("once", filter=Filter(types=["none"]))
    async def once(ctx, event):
        wakes.append(event.id)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=0.01) as y1, \
            yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=0.01) as y2:
        inst = await y1.instances(T).create("once", key="k")
        for i in range(5):
            await y1.store.actors.upsert_schedule(
                Schedule(T, inst.instance_id, f"s{i}", now_ms(), {"type": "go"}, created_at=now_ms())
            )
        await asyncio.gather(y1.executor.timers.fire_due(), y2.executor.timers.fire_due())
        await _until_idle(y1, inst)
    assert len(wakes) == 5


async def _until_idle(y, inst) -> None:
    while await y.store.actors.schedules(T, inst.instance_id):
        await asyncio.sleep(0.01)
    await y.wait_idle(timeout_s=10)


async def test_schedule_validation(fresh_url: str, tmp_path) -> None:
    app = App()
    problems: list[str] = []

    @app.actor("v", filter=Filter(types=["try"]), max_attempts=1)
    async def v(ctx, event):
        try:
            await ctx.schedules.upsert("x", event={"type": "t"}, **event.payload)
        except (InvalidSchedule, yoke.InvalidEvent) as exc:
            problems.append(exc.code)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("v", key="k")
        await y.stream("/", T).append_many([
            {"type": "try", "payload": {}},
            {"type": "try", "payload": {"after_s": 1, "cron": "* * * * *"}},
            {"type": "try", "payload": {"cron": "not cron"}},
            {"type": "try", "payload": {"after_s": -1}},
            {"type": "try", "payload": {"at": 1e16}},  # beyond a signed 64-bit count of ms
            {"type": "try", "payload": {"after_s": 1e16}},
            {"type": "try", "payload": {"at": -1e306}},  # beyond a float, in milliseconds
            {"type": "try", "payload": {"after_s": 1e306}},
        ])
        await y.wait_idle(timeout_s=10)
    assert problems == ["invalid_schedule"] * 8


@pytest.mark.parametrize("bad_event", [{"type": "yoke.forged"}, {"nope": 1}])
async def test_a_schedule_event_is_validated_when_set(fresh_url: str, tmp_path, bad_event) -> None:
    app = App()
    codes: list[str] = []

    @app.actor("v", filter=Filter(types=["try"]), max_attempts=1)
    async def v(ctx, event):
        try:
            await ctx.schedules.upsert("x", after_s=1, event=bad_event)
        except yoke.InvalidInput as exc:
            codes.append(exc.code)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("v", key="k")
        await y.stream("/", T).append({"type": "try"})
        await y.wait_idle(timeout_s=10)
    assert codes and codes[0] in ("reserved_event_type", "unknown_field")


@pytest.mark.parametrize("effects", ["default", "atomic"])
async def test_a_schedule_due_before_the_next_poll_fires_on_time(fresh_url: str, tmp_path, effects: str) -> None:
    """The timer loop polls every schedule_poll_s (5 s here) for what other
    processes set; a schedule this process sets wakes it at its due time, so
    a chain of schedules 0.1 s apart runs at that pace, not one per poll."""
    app = App()
    runs: list[float] = []
    done = asyncio.Event()

    @app.actor("chain", filter=Filter(types=["start"]), effects=effects)
    async def chain(ctx, event):
        runs.append(asyncio.get_running_loop().time())
        if len(runs) < 6:
            await ctx.schedules.upsert("next", after_s=0.1, event={"type": "tick"})
        else:
            done.set()

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), schedule_poll_s=5.0) as y:
        await y.instances(T).create("chain", key="k")
        await y.stream("/", T).append({"type": "start"})
        async with asyncio.timeout(20):
            await done.wait()
    # Five schedules 0.1 s apart: well under one 5 s poll (each takes a
    # claim and a run besides its 0.1 s).
    assert runs[-1] - runs[0] < 3.0, [round(b - a, 3) for a, b in zip(runs, runs[1:], strict=False)]
