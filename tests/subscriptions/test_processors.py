"""Stream processors: durable folds of a stream.

A processor's state must equal folding its stream's committed (durable)
events; its checkpoint (offset, state, version, source lifetime) is saved
with the cursor. A new version, a missing checkpoint or one of another
source lifetime rebuilds the state by replaying the log without running
``after``; an unfinished rebuild of the same version resumes where it
stopped. Every test runs on SQLite and PostgreSQL in a database of its own.
"""

from __future__ import annotations

import copy
import sqlite3
from dataclasses import replace
from typing import Any

import asyncpg
import pytest

import yoke
from yoke import errors
from yoke.store.subscriptions import Checkpoint

from .webhook_server import eventually

PATH = "/ledger"
NAME = "counter"
FAST = {
    "subscription_retry_base_s": 0.01,
    "subscription_retry_max_s": 0.05,
    "subscription_sweep_s": 0.1,
}


def initial(version: str) -> dict[str, Any]:
    return {"count": 0, "sum": 0, "offsets": [], "version": version}


def reduce_event(state: dict[str, Any], event: yoke.Event, weight: int, version: str) -> dict[str, Any]:
    """Pure: a new state, never the old one modified."""
    assert isinstance(event, yoke.Event)
    n = event.payload.get("n", 0) if isinstance(event.payload, dict) else 0
    return {
        "count": state["count"] + 1,
        "sum": state["sum"] + weight * n,
        "offsets": [*state["offsets"], event.offset],
        "version": version,
    }


class Probe:
    """What the test observes and steers: the ``after`` calls, and failures
    to inject into reduce or after (while ``fail_on`` names an offset)."""

    def __init__(self) -> None:
        self.after_calls: list[tuple[dict[str, Any], list[yoke.Event], Any]] = []
        self.fail_on: int | None = None
        self.fail_in: str = "reduce"
        self.reduce_failures = 0
        self.after_failures = 0

    def after_offsets(self) -> list[int]:
        return [e.offset for _, events, _ in self.after_calls for e in events]


def counter_app(version: str = "1", weight: int = 1, probe: Probe | None = None) -> tuple[yoke.App, Probe]:
    probe = probe or Probe()
    app = yoke.App()

    @app.processor(NAME)
    class Counter:
        def __init__(self) -> None:
            self.version = version

        def initial_state(self) -> dict[str, Any]:
            return initial(version)

        def reduce(self, state: dict[str, Any], event: yoke.Event) -> dict[str, Any]:
            if probe.fail_in == "reduce" and probe.fail_on == event.offset:
                probe.reduce_failures += 1
                raise RuntimeError(f"reduce refuses {event.offset}")
            return reduce_event(state, event, weight, version)

        async def after(self, state: dict[str, Any], events: list[yoke.Event], ctx: Any) -> None:
            if probe.fail_in == "after" and probe.fail_on in [e.offset for e in events]:
                probe.after_failures += 1
                raise RuntimeError(f"after refuses {probe.fail_on}")
            probe.after_calls.append((copy.deepcopy(state), list(events), ctx))

    return app, probe


def fold(events: list[yoke.Event], weight: int = 1, version: str = "1", state: dict[str, Any] | None = None):
    state = initial(version) if state is None else state
    for e in events:
        state = reduce_event(state, e, weight, version)
    return state


async def durable(s: yoke.Stream, through: int | None = None, after: int = 0) -> list[yoke.Event]:
    out = [e for e in await s.read(after, 10_000) if through is None or e.offset <= through]
    assert all(not e.ephemeral for e in out)
    return out


async def checkpoint(y: yoke.Runtime, tenant: str) -> Checkpoint | None:
    return await y.store.subscriptions.checkpoint(tenant, PATH, NAME)


async def delete_checkpoint_row(url: str, tenant: str) -> None:
    """No runtime is open: remove the row the way an operator (or a lost
    table) would."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            with conn:
                deleted = conn.execute(
                    "DELETE FROM processor_checkpoints WHERE tenant_id=? AND path=? AND name=?",
                    (tenant, PATH, NAME),
                ).rowcount
        finally:
            conn.close()
    else:
        conn = await asyncpg.connect(url)  # the superuser: row-level security does not apply
        try:
            status = await conn.execute(
                "DELETE FROM processor_checkpoints WHERE tenant_id=$1 AND path=$2 AND name=$3",
                tenant, PATH, NAME,
            )
            deleted = int(status.split()[-1])
        finally:
            await conn.close()
    assert deleted == 1


# --- folding, checkpoints, after -----------------------------------------------------------


async def test_a_counting_processor_folds_the_stream(fresh_url: str, tenant: str) -> None:
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        before = await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in (1, 2, 3)])
        sub = await s.subscribe(NAME, yoke.processor(NAME), start="now")
        live = [r.offset for r in await s.append_many(
            [{"type": "deposit", "payload": {"n": n}} for n in (10, 20, 30, 40, 50)]
        )]
        status = await s.wait_until_processed(NAME, live[-1], timeout_s=10)
        assert status.processed_through_offset == live[-1] and status.halted is None

        log = await durable(s)
        cp = await checkpoint(y, tenant)
        assert cp is not None and cp.complete and cp.version == "1"
        assert cp.through == live[-1]
        assert cp.stream_id == (await s.info()).stream_id
        # The state is the fold of every committed event through the cursor,
        # those before the start="now" subscription (and its configure event) included.
        assert cp.state == fold(log)
        assert cp.state["offsets"] == [r.offset for r in before] + [sub.offset] + live
        assert cp.state["sum"] == 6 + 150

        # after: only for delivered events (the initial build replayed the rest),
        # with the state that folds through them, and the events themselves.
        assert probe.after_offsets() == live
        for state, events, ctx in probe.after_calls:
            assert all(isinstance(e, yoke.Event) for e in events)
            assert state == fold([e for e in log if e.offset <= events[-1].offset])
            assert [e.to_dict() for e in events] == [
                e.to_dict() for e in log if e.offset in {x.offset for x in events}
            ]
            assert ctx.name == NAME and ctx.stream.path == PATH and ctx.stream.tenant == tenant
            # The run that delivered it: the source lifetime and the generation.
            info = await s.info()
            assert (ctx.stream_id, ctx.stream_created_at, ctx.generation) == (
                info.stream_id, info.created_at, sub.offset)


async def test_after_gets_the_new_state_and_the_events(fresh_url: str, tenant: str) -> None:
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe(NAME, yoke.processor(NAME), start="beginning")
        offsets = [(await s.append({"type": "deposit", "payload": {"n": n}})).offset for n in (5, 7)]
        await s.wait_until_processed(NAME, offsets[-1], timeout_s=10)
        # start="beginning": the configure event itself is delivered and folded.
        assert probe.after_offsets() == [sub.offset, *offsets]
        states = [state for state, _, _ in probe.after_calls]
        assert [st["sum"] for st in states] == [0, 5, 12]
        assert [st["offsets"] for st in states] == [
            [sub.offset], [sub.offset, offsets[0]], [sub.offset, *offsets],
        ]
        assert [e.payload for _, events, _ in probe.after_calls[1:] for e in events] == [{"n": 5}, {"n": 7}]


# --- rebuilds ---------------------------------------------------------------------------------


async def fill(url: str, tenant: str, count: int = 20) -> list[int]:
    """Run version 1 over ``count`` deposits; returns the durable offsets."""
    app, _ = counter_app("1")
    async with yoke.open(url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe(NAME, yoke.processor(NAME), start="beginning")
        results = await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in range(count)])
        await s.wait_until_processed(NAME, results[-1].offset, timeout_s=10)
        cp = await checkpoint(y, tenant)
        assert cp is not None and cp.complete and cp.version == "1"
        assert cp.state == fold(await durable(s))
        return [e.offset for e in await durable(s)]


async def test_a_new_version_rebuilds_by_replaying(fresh_url: str, tenant: str) -> None:
    old = await fill(fresh_url, tenant)
    app, probe = counter_app("2", weight=100)
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        new = (await s.append({"type": "deposit", "payload": {"n": 1000}})).offset
        await s.wait_until_processed(NAME, new, timeout_s=10)
        cp = await checkpoint(y, tenant)
        assert cp is not None and cp.complete and cp.version == "2" and cp.through == new
        log = await durable(s)
        assert cp.state == fold(log, weight=100, version="2")  # every event under the new reduce
        assert cp.state["offsets"] == [*old, new]
        # after ran for the new event only, with the rebuilt state.
        assert probe.after_offsets() == [new]
        assert probe.after_calls[0][0] == cp.state


@pytest.mark.parametrize("damage", ["deleted", "other_lifetime", "incomplete_other_version"])
async def test_a_missing_or_foreign_checkpoint_is_rebuilt(fresh_url: str, tenant: str, damage: str) -> None:
    old = await fill(fresh_url, tenant)
    if damage == "deleted":
        await delete_checkpoint_row(fresh_url, tenant)
    else:
        async with yoke.open(fresh_url, executor=False) as y:
            cp = await checkpoint(y, tenant)
            marker = {"count": 10**6, "sum": -1, "offsets": ["marker"], "version": "1"}
            if damage == "other_lifetime":  # complete, but of another source stream lifetime
                bad = replace(cp, stream_id="s_another_lifetime", state=marker)
            else:  # an unfinished rebuild of another version: not resumable under "1"
                bad = replace(cp, version="0", complete=False, through=old[len(old) // 2], state=marker)
            await y.store.subscriptions.save_checkpoint(bad, 0)
            assert await checkpoint(y, tenant) == bad

    app, probe = counter_app("1")
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        if damage == "deleted":
            assert await checkpoint(y, tenant) is None
        new = (await s.append({"type": "deposit", "payload": {"n": 1}})).offset
        await s.wait_until_processed(NAME, new, timeout_s=10)
        cp = await checkpoint(y, tenant)
        assert cp is not None and cp.complete and cp.version == "1" and cp.through == new
        assert cp.stream_id == (await s.info()).stream_id
        assert cp.state == fold(await durable(s))
        assert cp.state["offsets"] == [*old, new]
        assert probe.after_offsets() == [new]


async def test_an_interrupted_rebuild_resumes(fresh_url: str, tenant: str) -> None:
    """An unfinished rebuild of the current version, saved at offset K with a
    marker state: the rebuild continues from K (the marker survives and only
    the events after K are folded onto it), not from the start."""
    old = await fill(fresh_url, tenant)
    k = old[len(old) // 2]
    marker = {"count": 1000, "sum": 7, "offsets": ["marker"], "version": "2"}
    async with yoke.open(fresh_url, executor=False) as y:
        s = y.stream(PATH, tenant)
        stream_id = (await s.info()).stream_id
        generation = (await s.subscription(NAME)).generation
        stage = Checkpoint(tenant, PATH, NAME, "2", stream_id, generation, k, marker, False)
        assert await y.store.subscriptions.save_checkpoint(stage, 0)

    app, probe = counter_app("2", weight=100)
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        new = (await s.append({"type": "deposit", "payload": {"n": 3}})).offset
        await s.wait_until_processed(NAME, new, timeout_s=10)
        cp = await checkpoint(y, tenant)
        assert cp is not None and cp.complete and cp.version == "2" and cp.through == new
        expected = fold(await durable(s, after=k), weight=100, version="2", state=marker)
        assert cp.state == expected
        assert cp.state["offsets"] == ["marker", *[o for o in old if o > k], new]
        assert probe.after_offsets() == [new]


# --- ephemeral events, failures, refusals -------------------------------------------------------


async def test_ephemeral_events_are_never_folded(fresh_url: str, tenant: str) -> None:
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe(NAME, yoke.processor(NAME), start="beginning")
        durable_offsets, ephemeral_offsets = [sub.offset], []
        for i, flag in enumerate([True, False, True, True, False, True]):
            r = await s.append({"type": "tick" if flag else "deposit", "payload": {"n": i}, "ephemeral": flag})
            (ephemeral_offsets if flag else durable_offsets).append(r.offset)
        status = await s.wait_until_processed(NAME, ephemeral_offsets[-1], timeout_s=10)
        assert status.processed_through_offset == ephemeral_offsets[-1]
        cp = await checkpoint(y, tenant)
        assert cp.state["offsets"] == durable_offsets
        assert cp.state["sum"] == 1 + 4
        assert probe.after_offsets() == durable_offsets
        assert not any(e.ephemeral for _, events, _ in probe.after_calls for e in events)


@pytest.mark.parametrize("where", ["reduce", "after"])
async def test_a_failing_fold_retries_without_advancing(fresh_url: str, tenant: str, where: str) -> None:
    probe = Probe()
    probe.fail_in = where
    app, _ = counter_app(probe=probe)
    # A ladder slow enough (15 attempts take ~1.3 s) to stop failing before a halt.
    settings = {**FAST, "subscription_retry_base_s": 0.02, "subscription_retry_max_s": 0.1}
    async with yoke.open(fresh_url, app=app, **settings) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe(NAME, yoke.processor(NAME), start="now")
        probe.fail_on = sub.offset + 2
        e1, e2, e3 = [r.offset for r in await s.append_many(
            [{"type": "deposit", "payload": {"n": n}} for n in (1, 2, 3)]
        )]
        assert e2 == probe.fail_on

        async def failing():
            st = await s.subscription(NAME)
            return st if st.attempts >= 2 else None

        status = await eventually(failing, what="two failed attempts")
        assert status.processed_through_offset == e1 and status.halted is None
        assert "refuses" in status.last_error
        cp = await checkpoint(y, tenant)
        assert cp.through == e1 and e2 not in cp.state["offsets"]

        probe.fail_on = None
        await s.wait_until_processed(NAME, e3, timeout_s=10)
        cp = await checkpoint(y, tenant)
        log = await durable(s)
        assert cp.state == fold(log)  # each event folded exactly once, retries notwithstanding
        assert cp.state["offsets"].count(e2) == 1
        assert probe.after_offsets() == [e1, e2, e3]  # after succeeded once per event
        failures = probe.reduce_failures if where == "reduce" else probe.after_failures
        assert failures >= 2
        assert (await s.subscription(NAME)).failures == failures


async def test_a_transform_on_a_processor_is_refused(fresh_url: str, tenant: str) -> None:
    app, _ = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        with pytest.raises(errors.InvalidSubscription) as refused:
            await s.subscribe(NAME, yoke.processor(NAME), transform='{"type": "x"}')
        assert refused.value.code == "invalid_subscription"
        assert await y.store.info(tenant, PATH) is None  # nothing appended, not even the stream
        head = (await s.append({"type": "deposit", "payload": {"n": 1}})).offset
        with pytest.raises(errors.InvalidSubscription):
            await s.subscribe(NAME, yoke.processor(NAME), transform="$", start="beginning")
        assert (await s.info()).head == head and await s.subscriptions() == []
        assert await checkpoint(y, tenant) is None


# --- rebuild and live folding agree ----------------------------------------------------------


async def test_a_rebuild_over_several_pages(fresh_url: str, tenant: str) -> None:
    """1,200 events before a start="now" subscription: the first fold
    replays them (more than one page of the rebuild) without ``after``."""
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in range(1200)])
        await s.subscribe(NAME, yoke.processor(NAME), start="now")
        new = (await s.append({"type": "deposit", "payload": {"n": 5}})).offset
        await s.wait_until_processed(NAME, new, timeout_s=20)
        cp = await checkpoint(y, tenant)
        log = await durable(s)
        assert len(log) == 1202
        assert cp.complete and cp.through == new and cp.state == fold(log)
        assert probe.after_offsets() == [new]


async def test_a_filtered_processor_folds_the_same_live_and_rebuilt(fresh_url: str, tenant: str) -> None:
    flt = {"types": ["deposit"], "where": "payload.n > 0"}
    app, probe = counter_app("1")
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.append({"type": "deposit", "payload": {"n": 4}})  # before the subscription
        await s.subscribe(NAME, yoke.processor(NAME), filter=flt, start="now")
        batch = [
            {"type": "deposit", "payload": {"n": 1}},
            {"type": "withdrawal", "payload": {"n": 9}},
            {"type": "deposit", "payload": {"n": 0}},
            {"type": "deposit", "payload": {"n": 2}},
            {"type": "note", "payload": {}},
        ]
        offsets = [r.offset for r in await s.append_many(batch)]
        await s.wait_until_processed(NAME, offsets[-1], timeout_s=10)
        log = await durable(s)
        matching = [e for e in log if e.type == "deposit" and e.payload.get("n", 0) > 0]
        live = await checkpoint(y, tenant)
        assert live.state == fold(matching)
        assert probe.after_offsets() == [offsets[0], offsets[3]]

    app2, probe2 = counter_app("2")
    async with yoke.open(fresh_url, app=app2, **FAST) as y:
        s = y.stream(PATH, tenant)
        last = (await s.append({"type": "deposit", "payload": {"n": 3}})).offset
        await s.wait_until_processed(NAME, last, timeout_s=10)
        log = await durable(s)
        matching = [e for e in log if e.type == "deposit" and e.payload.get("n", 0) > 0]
        rebuilt = await checkpoint(y, tenant)
        assert rebuilt.state == fold(matching, version="2")
        assert rebuilt.state["offsets"] == live.state["offsets"] + [last]
        assert probe2.after_offsets() == [last]


async def test_moving_the_cursor_back_refolds_from_there(fresh_url: str, tenant: str) -> None:
    """set_cursor(k) on a processor: its state goes back to the fold through
    k, and the events after k are folded (and given to ``after``) again, once."""
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe(NAME, yoke.processor(NAME), start="beginning")
        offsets = [r.offset for r in await s.append_many(
            [{"type": "deposit", "payload": {"n": n}} for n in range(1, 11)]
        )]
        await s.wait_until_processed(NAME, offsets[-1], timeout_s=10)
        k = offsets[4]
        probe.after_calls.clear()
        moved = await s.set_cursor(NAME, k)
        head = (await s.info()).head  # the cursor_set event follows
        await s.wait_until_processed(NAME, head, timeout_s=10)
        cp = await checkpoint(y, tenant)
        assert cp.through == head
        assert cp.state == fold(await durable(s))  # every event once, not the tail twice
        assert probe.after_offsets() == [o for o in offsets if o > k] + [moved.generation]


# --- found bugs (see the reasons) -----------------------------------------------------------------


async def settled(s: yoke.Stream, name: str, offset: int, timeout_s: float = 5.0):
    """The subscription once it processed ``offset`` or halted."""

    async def check():
        st = await s.subscription(name)
        return st if st.processed_through_offset >= offset or st.halted is not None else None

    return await eventually(check, timeout_s=timeout_s, what=f"{name} through {offset} or halted")


async def test_a_processor_subscribed_again_folds_what_happened_meanwhile(fresh_url: str, tenant: str) -> None:
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe(NAME, yoke.processor(NAME), start="beginning")
        first = await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in (1, 2, 3)])
        await s.wait_until_processed(NAME, first[-1].offset, timeout_s=10)
        await s.unsubscribe(NAME)
        await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in (100, 200)])
        await s.subscribe(NAME, yoke.processor(NAME), start="now")
        last = (await s.append({"type": "deposit", "payload": {"n": 5}})).offset
        status = await settled(s, NAME, last)
        assert status.halted is None
        cp = await checkpoint(y, tenant)
        # As without the leftover checkpoint: the fold of every event through the cursor.
        assert cp.state == fold(await durable(s))


async def test_a_replaced_processor_does_not_inherit_the_old_state(fresh_url: str, tenant: str) -> None:
    app = yoke.App()

    @app.processor("tally")
    class Tally:
        version = "1"

        def initial_state(self) -> dict[str, Any]:
            return {"tally": 0}

        def reduce(self, state: dict[str, Any], event: yoke.Event) -> dict[str, Any]:
            return {"tally": state["tally"] + 1}

    @app.processor("seen")
    class Seen:
        version = "1"

        def initial_state(self) -> dict[str, Any]:
            return {"seen": []}

        def reduce(self, state: dict[str, Any], event: yoke.Event) -> dict[str, Any]:
            return {"seen": [*state["seen"], event.offset]}

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("p", yoke.processor("tally"), start="beginning")
        first = await s.append_many([{"type": "x"}] * 3)
        await s.wait_until_processed("p", first[-1].offset, timeout_s=10)
        await s.subscribe("p", yoke.processor("seen"), start="now")
        last = (await s.append({"type": "x"})).offset
        status = await settled(s, "p", last)
        assert status.halted is None, status.halted
        cp = await y.store.subscriptions.checkpoint(tenant, PATH, "p")
        assert cp.state == {"seen": [e.offset for e in await durable(s)]}


async def test_a_reduce_failing_during_a_rebuild_is_retried_visibly_then_halts(
    fresh_url: str, tenant: str
) -> None:
    app, probe = counter_app()
    async with yoke.open(fresh_url, app=app, deploy_version="v-test", **FAST) as y:
        s = y.stream(PATH, tenant)
        old = await s.append_many([{"type": "deposit", "payload": {"n": n}} for n in (1, 2, 3)])
        probe.fail_on = old[1].offset  # replayed by the initial build of a start="now" processor
        await s.subscribe(NAME, yoke.processor(NAME), start="now")
        await s.append({"type": "deposit", "payload": {"n": 5}})

        async def visible():
            st = await s.subscription(NAME)
            return st if st.last_error or st.halted else None

        status = await eventually(visible, timeout_s=3, what="a recorded failure")
        assert "reduce refuses" in (status.last_error or status.halted["error"])

        async def halted():
            st = await s.subscription(NAME)
            return st if st.halted is not None else None

        status = await eventually(halted, timeout_s=10, what="the halt")
        assert status.halted["attempts"] == 15 and status.halted["version"] == "v-test"
        assert any(e.type == "yoke.subscription.halted" for e in await s.read(0))
