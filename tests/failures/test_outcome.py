"""What became of a replay, from Python, on both backends:
``replay(..., wait=True)`` and ``Failures.outcome`` wait for a dead letter's
row to be processed or dead again, for a halted subscription to pass the
event or record a new error, and say what is still pending at the timeout.
A subscription keeps its last error and its time once it recovers."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import Filter, errors

from ..subscriptions.common import FAST, until
from .test_inbox import T, audits, receiving_app


def gated_app(mode: dict, gate: asyncio.Event) -> yoke.App:
    """``orders``: fails while ``mode["fail"]``, waits for ``gate`` while ``mode["block"]``."""
    app = yoke.App()

    @app.actor("orders", filter=Filter(types=["order"]), max_attempts=2, retry_base_s=0.01, retry_max_s=0.02)
    async def orders(ctx, event):
        if mode["fail"]:
            raise ValueError(f"order {event.payload['n']} refused")
        if mode["block"]:
            await gate.wait()

    return app


async def test_a_dead_letter_replay_waits_for_its_row(fresh_url: str, tmp_path) -> None:
    mode = {"fail": True, "block": False}
    gate = asyncio.Event()
    async with yoke.open(fresh_url, app=gated_app(mode, gate), data_dir=str(tmp_path)) as y:
        inbox = y.failures(T)
        inst = await y.instances(T).create("orders", key="k")
        await y.stream("/orders", T).append({"type": "order", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=10)
        [f] = await inbox.list()

        # Still refused: dead again, with its new error and time; the failure is open again (same id).
        done = await inbox.replay(f.id, wait=True, timeout_s=10)
        o = done.outcome
        assert (o.state, o.error) == ("failed", "ValueError: order 1 refused"), o
        assert o.detail.endswith(f"of instance {inst.instance_id} is dead again after 2 attempt(s)")
        [again] = await inbox.list()
        assert again.id == f.id and o.error_at == again.attempts[-1].at > f.failed_at
        assert done.to_dict()["outcome"] == o.to_dict()

        # Taken but not finished when the wait ends: pending, saying what it waits for.
        mode.update(fail=False, block=True)
        done = await inbox.replay(f.id, wait=True, timeout_s=0)
        assert done.outcome.state == "pending" and "queue row" in done.outcome.detail, done.outcome
        assert done.outcome.detail.startswith("after 0 s, ")
        gate.set()
        o = await inbox.outcome(done, timeout_s=10)  # the same replay, waited for again
        assert (o.state, o.error) == ("done", None) and o.detail.endswith("was processed"), o
        assert await inbox.list() == []
        # A timeout out of range is refused before anything is replayed.
        with pytest.raises(errors.InvalidInput):
            await inbox.replay(f.id, wait=True, timeout_s=-1)
        assert len(await audits(y.stream("/orders", T), "replayed")) == 2


async def test_a_halt_replay_waits_for_the_cursor_or_a_new_error(fresh_url: str) -> None:
    seen: list = []
    fail = {2}
    async with yoke.open(fresh_url, app=receiving_app(fail, seen), **FAST) as y:
        s = y.stream("/s", T)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x", "payload": {"n": n}} for n in (1, 2, 3)])  # offsets 2..4
        halted = await until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        inbox = y.failures(T)
        [f] = await inbox.list()
        # The halt stamped its error's time: the halting attempt's.
        assert halted.last_error == f.error and halted.last_error_at == f.attempts[-1].at

        # Still refused: a failed attempt after the resume is the outcome (with
        # these fast retries it may have halted again by the time the wait looks).
        o = (await inbox.replay(f.id, wait=True, timeout_s=10)).outcome
        assert (o.state, o.error) == ("failed", "RuntimeError: cannot take offset 2"), o
        assert ("attempt" in o.detail and "at offset 2" in o.detail) or "halted again at offset 2" in o.detail
        assert o.error_at >= f.failed_at
        # It goes on retrying, halts again (a new failure), and now the receiver takes it.
        await until(inbox.list, lambda fs: len(fs) == 1 and fs[0].id != f.id)
        [g] = await inbox.list()
        fail.clear()
        done = await inbox.replay(g.id, wait=True, timeout_s=10)
        assert done.outcome.state == "done" and "past the replayed offset 2" in done.outcome.detail, done.outcome
        assert [o for o, _ in seen][:1] == [2]
        # Recovered: running, and still saying when it last failed.
        status = await s.wait_until_processed("rec", 4, timeout_s=10)
        assert status.state == "running" and status.attempts == 0
        assert status.last_error == "RuntimeError: cannot take offset 2" and status.last_error_at == g.attempts[-1].at


async def test_a_skip_replay_is_settled_in_the_call(fresh_url: str) -> None:
    seen: list = []
    async with yoke.open(fresh_url, app=receiving_app(set(), seen), **FAST) as y:
        s = y.stream("/s", T)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning",
                          on_failing_event="skip")
        sent = await s.append({"type": "x", "payload": {"n": 1, "poison": True}})
        await s.wait_until_processed("rec", sent.offset, timeout_s=10)
        [f] = await y.failures(T).list()
        done = await y.failures(T).replay(f.id, patch={"payload": {"poison": None}}, wait=True, timeout_s=10)
        assert done.outcome.state == "done" and done.outcome.detail.endswith("was delivered to rec in the replay")
        assert seen == [(sent.offset, {"n": 1})]
