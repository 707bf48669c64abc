"""The failures inbox under concurrency, on both backends: two actions on
one subscription failure resolve it once (one delivery and one audit event
in a process; one audit event and one success across processes, whose stale
reads the module functions stand in for), and a listing or a metrics scrape
reads only the events it returns."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

import yoke
from yoke import errors
from yoke.failures import inbox as inbox_module
from yoke.failures import subscriptions as subscription_failures

from ..subscriptions.common import FAST, until
from .test_inbox import T, audits, poisoned

GATED = "gated"


def gated_app(seen: list, gate: asyncio.Event, entered: list | None = None) -> yoke.App:
    """``rec`` fails a poisoned event; any other delivery is counted in
    ``entered``, waits at ``gate`` (opened by the test) and is then recorded
    in ``seen``."""
    app = yoke.App()

    @app.receiver("rec")
    async def rec(batch: dict) -> None:
        for e in batch["events"]:
            if poisoned(e):
                raise RuntimeError(f"cannot take offset {e['offset']}")
        if entered is not None:
            entered.append(batch)
        await gate.wait()
        seen.extend((e["offset"], e["payload"]) for e in batch["events"])

    return app


@asynccontextmanager
async def serving(url: str, seen: list, gate: asyncio.Event | None = None, entered: list | None = None):  # noqa: ANN201
    """A runtime whose application is ``gated_app`` (its gate open unless
    one is given), and its stream ``/s``."""
    if gate is None:
        gate = asyncio.Event()
        gate.set()
    async with yoke.open(url, app=gated_app(seen, gate, entered), **FAST) as y:
        yield y, y.stream("/s", T)


async def skipped_one(y: yoke.Runtime, s) -> yoke.failures.Failure:  # noqa: ANN001
    await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning", on_failing_event="skip")
    sent = await s.append({"type": "x", "payload": {"n": 1, "poison": True}})
    await s.wait_until_processed("rec", sent.offset, timeout_s=10)
    [f] = await y.failures(T).list()
    assert f.kind == "skipped"
    return f


async def halted_one(y: yoke.Runtime, s) -> yoke.failures.Failure:  # noqa: ANN001
    await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
    await s.append({"type": "x", "payload": {"n": 1, "poison": True}})
    await until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
    [f] = await y.failures(T).list()
    assert f.kind == "halted"
    return f


def claim_users(failure_id: str) -> int:
    """How many actions hold or wait for the failure's in-process claim."""
    return inbox_module._claims.get((T, failure_id), (None, 0))[1]


async def now(value):  # noqa: ANN001, ANN201
    return value()


async def test_two_concurrent_replays_of_a_skip_deliver_and_audit_once(fresh_url: str) -> None:
    seen: list = []
    entered: list = []
    gate = asyncio.Event()
    async with serving(fresh_url, seen, gate, entered) as (y, s):
        f = await skipped_one(y, s)
        inbox = y.failures(T)
        first = asyncio.create_task(inbox.replay(f.id, {"payload": {"n": 1}}))
        await until(lambda: now(lambda: len(entered)), lambda n: n == 1)  # delivering, held at the gate
        second = asyncio.create_task(inbox.replay(f.id, {"payload": {"n": 1}}))
        # The second waits for the claim (without one, it would enter the receiver too).
        await until(lambda: now(lambda: (claim_users(f.id), len(entered))), lambda st: st[0] == 2 or st[1] == 2)
        gate.set()
        done, refused = await asyncio.gather(first, second, return_exceptions=True)
        assert done.delivered and isinstance(refused, errors.FailureNotFound)
        assert seen == [(f.offset, {"n": 1})] and len(entered) == 1  # delivered once
        assert [a.offset for a in await audits(s, "replayed")] == [done.audit_offset]
        assert claim_users(f.id) == 0  # no claim left behind


async def test_a_stale_skip_is_resolved_once_across_processes(fresh_url: str) -> None:
    """Another process acting on what it read before this one resolved the
    skip (the module functions, without this process's claim): the store
    refuses its record; no second audit event."""
    seen: list = []
    async with serving(fresh_url, seen) as (y, s):
        stale = await skipped_one(y, s)
        await y.failures(T).replay(stale.id, {"payload": {"n": 1}})
        with pytest.raises(errors.FailureNotFound):
            await subscription_failures.replay(y.failures(T).services, T, stale, {**stale.event, "payload": {"n": 2}}, {"payload": {"n": 2}})
        with pytest.raises(errors.FailureNotFound):
            await subscription_failures.discard(y.failures(T).services, T, stale, "late")
        assert len(await audits(s, "replayed")) == 1 and await audits(s, "discarded") == []
        assert seen[0] == (stale.offset, {"n": 1})


async def test_a_corrected_halt_replay_racing_an_as_is_one_delivers_nothing_unaudited(fresh_url: str) -> None:
    seen: list = []
    gate = asyncio.Event()
    async with serving(fresh_url, seen, gate) as (y, s):
        f = await halted_one(y, s)
        inbox = y.failures(T)
        first = asyncio.create_task(inbox.replay(f.id, {"payload": {"n": 1}}))  # waits in the receiver
        second = asyncio.create_task(inbox.replay(f.id))  # as it is: would resume the subscription
        await until(lambda: now(lambda: claim_users(f.id)), lambda users: users == 2)
        gate.set()
        done, refused = await asyncio.gather(first, second, return_exceptions=True)
        assert done.delivered and isinstance(refused, errors.FailureNotFound)
        assert seen == [(f.offset, {"n": 1})]  # the original was never delivered again
        [audit] = await audits(s, "replayed")
        assert audit.offset == done.audit_offset and audit.payload["corrected"] == {"payload": {"n": 1}}
        assert (await s.subscription("rec")).halted is None


async def test_a_stale_corrected_halt_replay_delivers_nothing(fresh_url: str) -> None:
    """The halt is checked before delivering: another process's corrected
    replay of a halt resolved meanwhile neither delivers nor records."""
    seen: list = []
    async with serving(fresh_url, seen) as (y, s):
        stale = await halted_one(y, s)
        await y.failures(T).discard(stale.id, "test data")
        with pytest.raises(errors.FailureNotFound):
            await subscription_failures.replay(y.failures(T).services, T, stale, {**stale.event, "payload": {"n": 1}}, {"payload": {"n": 1}})
        assert seen == [] and await audits(s, "replayed") == []


async def test_a_halt_whose_cursor_moved_back_is_refused_before_delivering(fresh_url: str) -> None:
    seen: list = []
    async with serving(fresh_url, seen) as (y, s):
        f = await halted_one(y, s)
        assert f.offset == 2  # after the configure event
        await s.set_cursor("rec", 0)  # still halted, now behind the halted event
        inbox = y.failures(T)
        with pytest.raises(errors.FailureNotReplayable) as replayed:
            await inbox.replay(f.id, {"payload": {"n": 1}})
        assert "replay it as it is" in replayed.value.message and seen == []  # nothing delivered
        with pytest.raises(errors.FailureNotReplayable) as discarded:
            await inbox.discard(f.id, "test data")
        message = discarded.value.message
        assert "replay" not in message and f"move the cursor to {f.offset - 1}" in message
        assert await audits(s, "replayed") == [] and await audits(s, "discarded") == []


class CountedReads:
    """The store's ``read_one`` (what a failure's event is read with), counted."""

    def __init__(self, y: yoke.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        read_one = y.store.read_one

        async def counted(tenant: str, path: str, offset: int):  # noqa: ANN202
            self.paths.append(path)
            return await read_one(tenant, path, offset)

        monkeypatch.setattr(y.store, "read_one", counted)


async def test_a_listing_reads_the_events_of_its_page_only_and_ages_none(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list = []
    async with serving(fresh_url, seen) as (y, s):
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning", on_failing_event="skip")
        sent = await s.append_many([  # a good event between poisoned ones: a third failing one in a row halts
            {"type": "x", "payload": {"n": n, "poison": n % 2 == 0}} for n in range(9)])
        await s.wait_until_processed("rec", sent[-1].offset, timeout_s=10)
        inbox = y.failures(T)
        assert len(await inbox.list()) == 5
        reads = CountedReads(y, monkeypatch)
        [oldest] = await inbox.list(limit=1)
        assert oldest.offset == sent[0].offset and oldest.event["payload"] == {"n": 0, "poison": True}
        assert reads.paths == ["/s"]  # one event read, not five
        reads.paths.clear()
        ages = await inbox.ages()
        assert sorted(k for k, _, _ in ages) == ["skipped"] * 5 and reads.paths == []
