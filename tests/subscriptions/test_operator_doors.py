"""Operator doors (control events appended on the source): pause and halt by command, parked status, and
halts that no deployment resumes."""

from __future__ import annotations

import asyncio

import yoke

from .common import FAST, control_events
from .test_delivery import _until, delivered, recording_app


async def test_a_halt_recorded_without_a_version_waits_for_the_operator(fresh_url: str) -> None:
    """A process without a deploy version halts (version ''); the first
    process with a version must not resume it: 'Halts recorded before the
    version stamp are grandfathered to the operator doors.'"""
    broken, _ = recording_app(None, fail_on=(2,))
    async with yoke.open(fresh_url, app=broken, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append({"type": "x"})
        halted = await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        assert halted.halted["version"] == "" and halted.state == "halted"
    fixed, got = recording_app("v2")
    async with yoke.open(fresh_url, app=fixed, **FAST) as y:
        s = y.stream("/s")
        await y.deliveries.sweep()
        await y.deliveries.sweep()
        status = await s.subscription("rec")
        assert status.halted is not None and status.delivering is None
        assert not [e for e in await control_events(s) if e.type == "yoke.subscription.resumed"]
        assert got == []
        await s.resume("rec")  # the operator's door
        await s.wait_until_processed("rec", 2, timeout_s=20)
        assert delivered(got) == [2]


async def test_pause_parks_keeps_the_cursor_and_resume_continues(fresh_url: str) -> None:
    app, batches = recording_app("v1")
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x"}] * 2)  # 2, 3
        await s.wait_until_processed("rec", 3, timeout_s=20)
        paused = await s.pause("rec")
        assert paused.state == "parked" and paused.halted is None
        assert paused.parked["reason"] == "operator" and paused.parked["offset"] == 4
        assert paused.processed_through_offset == 3
        assert (await s.pause("rec")).parked == paused.parked  # pausing again changes nothing
        await s.append_many([{"type": "x"}] * 2)  # 5, 6: not delivered while parked
        await y.deliveries.sweep()
        await asyncio.sleep(0)
        status = await s.subscription("rec")
        # A pass already running when the pause landed may still acknowledge
        # the pause's own control event (offset 4, which no filter matches);
        # nothing after it moves while parked.
        assert (status.state, status.delivering) == ("parked", None)
        assert status.processed_through_offset in (3, 4)
        assert delivered(batches) == [2, 3]
        events = await control_events(s)
        assert events[-1].type == "yoke.subscription.paused"
        assert events[-1].payload == {"name": "rec", "reason": "operator", "offset": 4}
        # A deployment of another version does not resume a pause.
        other, got = recording_app("v2")
        async with yoke.open(fresh_url, app=other, **FAST) as y2:
            await y2.deliveries.sweep()
            assert (await s.subscription("rec")).state == "parked" and got == []
        resumed = await s.resume("rec")
        assert resumed.state == "running" and resumed.parked is None
        await s.wait_until_processed("rec", 6, timeout_s=20)
        assert delivered(batches) == [2, 3, 5, 6]
        # The log alone says the same: a rebuild finds it running again.
        [rebuilt] = await s.rebuild_subscriptions()
        assert rebuilt.state == "running" and rebuilt.processed_through_offset >= 6


async def test_halt_by_command_is_recorded_and_only_the_operator_resumes_it(fresh_url: str) -> None:
    app, batches = recording_app("v1")
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append({"type": "x"})
        await s.wait_until_processed("rec", 2, timeout_s=20)
        halted = await s.halt("rec")
        assert halted.state == "halted" and halted.halted["reason"] == "operator"
        assert (halted.halted["offset"], halted.halted["version"]) == (3, "")
        event = (await control_events(s))[-1]
        assert (event.type, event.payload["reason"], event.payload["version"]) == (
            "yoke.subscription.halted", "operator", "")
        await s.append({"type": "x"})
        [rebuilt] = await s.rebuild_subscriptions()  # the log records it
        assert rebuilt.state == "halted" and rebuilt.halted["reason"] == "operator"
    other, got = recording_app("v2")
    async with yoke.open(fresh_url, app=other, **FAST) as y:
        s = y.stream("/s")
        await y.deliveries.sweep()
        assert (await s.subscription("rec")).state == "halted" and got == []
        # A paused one halted by command is halted; a halted one paused stays halted.
        assert (await s.pause("rec")).state == "halted"
        await s.set_cursor_and_resume("rec", 2)  # 3 is the halted event, 4 the x appended since
        await s.wait_until_processed("rec", 4, timeout_s=20)
        assert delivered(got) == [4]
        await s.pause("rec")
        assert (await s.halt("rec")).state == "halted"
