"""The failures inbox from Python, on both backends: dead letters, halted
subscriptions and skipped events listed in one place, shown, replayed as
they are or corrected, discarded with a reason, one by one and by filter;
every action audited on the stream it concerns."""

from __future__ import annotations

import pytest

import yoke
from yoke import Filter, errors

from ..subscriptions.common import FAST, until

T = "acme"


def poisoned(doc: dict) -> bool:
    return isinstance(doc.get("payload"), dict) and bool(doc["payload"].get("poison"))


def actor_app(seen: list) -> yoke.App:
    app = yoke.App()

    @app.actor("orders", filter=Filter(types=["order"]), max_attempts=2, retry_base_s=0.01, retry_max_s=0.02)
    async def orders(ctx, event):
        if poisoned(event.to_dict()):
            raise ValueError(f"poisoned order {event.payload['n']}")
        seen.append((event.payload["n"], (event.source or {}).get("replay_of")))

    return app


async def audits(stream, kind: str) -> list:  # noqa: ANN001
    return [e for e in await stream.read(limit=10_000) if e.type == f"yoke.failure.{kind}"]


async def test_dead_letters_listed_shown_replayed_corrected_and_discarded(fresh_url: str, tmp_path) -> None:
    seen: list = []
    async with yoke.open(fresh_url, app=actor_app(seen), data_dir=str(tmp_path)) as y:
        inbox = y.failures(T)
        inst = await y.instances(T).create("orders", key="k")
        s = y.stream("/orders", T)
        sent = await s.append_many([
            {"type": "order", "payload": {"n": 1, "poison": True}},
            {"type": "order", "payload": {"n": 2}},
            {"type": "order", "payload": {"n": 3, "poison": True}},
            {"type": "order", "payload": {"n": 4, "poison": True}},
        ])
        await y.wait_idle(timeout_s=10)
        listed = await inbox.list()
        # Oldest first by the last attempt's time, which retry jitter orders: pick them by offset.
        assert sorted(f.offset for f in listed) == [1, 3, 4]
        assert [(f.failed_at, f.id) for f in listed] == sorted((f.failed_at, f.id) for f in listed)
        first, third, fourth = (next(f for f in listed if f.offset == o) for o in (1, 3, 4))
        assert (first.kind, first.receiver, first.path, first.actor, first.instance_id) == (
            "dead_letter", "actor", "/orders", "orders", inst.instance_id)
        assert first.id.startswith("dl_") and first.attempt_count == 2
        assert first.error == "ValueError: poisoned order 1" and "raise ValueError" in first.traceback
        assert [(a.number, a.error) for a in first.attempts] == [(n, "ValueError: poisoned order 1") for n in (1, 2)]
        assert first.attempts[0].at <= first.attempts[1].at and first.failed_at <= first.attempts[1].at
        assert first.event["id"] == sent[0].id and first.event["payload"] == {"n": 1, "poison": True}
        assert await inbox.get(first.id) == first
        # Filters: by kind, receiver, stream, actor, instance and time.
        assert len(await inbox.list(kind="dead_letter", actor="orders", stream="/orders")) == 3
        assert await inbox.list(kind="halted") == [] and await inbox.list(actor="other") == []
        assert await inbox.list(stream="/elsewhere") == [] and await inbox.list(receiver="webhook") == []
        assert len(await inbox.list(instance_id=inst.instance_id, limit=2)) == 2
        assert await inbox.list(since=listed[-1].failed_at + 1) == []
        assert [f.id for f in await inbox.list(until=listed[1].failed_at)] == [
            f.id for f in listed if f.failed_at < listed[1].failed_at]
        assert [f.id for f in await inbox.list(since=listed[1].failed_at)] == [
            f.id for f in listed if f.failed_at >= listed[1].failed_at]

        # Replay with a corrected event: a new event whose provenance names the original.
        done = await inbox.replay(first.id, {"payload": {"n": 1, "fixed": True}})
        await y.wait_idle(timeout_s=10)
        [(n, replay_of)] = [x for x in seen if x[0] == 1]
        assert replay_of == {"failure": first.id, "id": sent[0].id, "path": "/orders", "offset": 1}
        with pytest.raises(errors.FailureNotFound):
            await inbox.get(first.id)
        [audit] = await audits(s, "replayed")
        assert audit.offset == done.audit_offset and done.audit_path == "/orders"
        assert audit.payload["failure"] == first.id
        assert audit.payload["corrected"] == {"payload": {"n": 1, "fixed": True}}
        assert (await s.get(1)).payload == {"n": 1, "poison": True}  # history untouched

        # Replay as it is: still poisoned, it dies again under the same id.
        again = await inbox.replay(third.id)
        await y.wait_idle(timeout_s=10)
        assert again.action == "replayed"
        reparked = await inbox.get(third.id)
        assert reparked.attempt_count == 2 and [a.number for a in reparked.attempts] == [1, 2]  # a new round

        # Discard with a reason.
        gone = await inbox.discard(fourth.id, "duplicate order, refunded by hand")
        [audit] = await audits(s, "discarded")
        assert audit.offset == gone.audit_offset and audit.payload["reason"] == "duplicate order, refunded by hand"
        assert [f.offset for f in await inbox.list()] == [3]
        with pytest.raises(errors.FailureNotFound):
            await inbox.discard(fourth.id, "twice")
        assert sorted(n for n, _ in seen) == [1, 2]  # nothing processed twice


async def test_dead_letters_in_bulk_by_filter(fresh_url: str, tmp_path) -> None:
    seen: list = []
    async with yoke.open(fresh_url, app=actor_app(seen), data_dir=str(tmp_path)) as y:
        inbox = y.failures(T)
        await y.instances(T).create("orders", key="k")
        await y.stream("/a", T).append_many([{"type": "order", "payload": {"n": n, "poison": True}} for n in (1, 2)])
        await y.stream("/b", T).append_many([{"type": "order", "payload": {"n": n, "poison": True}} for n in (3, 4)])
        await y.wait_idle(timeout_s=10)
        assert len(await inbox.list()) == 4
        checked: list = []

        async def refuse(failures: list) -> None:
            checked.extend(f.id for f in failures)
            raise errors.DataHandlingPinned("refused", path="/b")

        with pytest.raises(errors.DataHandlingPinned):  # what check raises refuses them all
            await inbox.replay_all(stream="/b", event={"payload": {"n": 0}}, check=refuse)
        b_failures = [f.id for f in await inbox.list(stream="/b")]
        assert checked == b_failures and len(b_failures) == 2  # the very failures it would replay
        bulk = await inbox.replay_all(stream="/a", event={"payload": {"n": 0}})
        assert len(bulk.done) == 2 and bulk.failed == []
        await y.wait_idle(timeout_s=10)
        assert [n for n, _ in seen] == [0, 0]
        await y.stream("/b", T).close()  # closed to appends: the audit events still go in
        dropped = await inbox.discard_all("test data", kind="dead_letter")
        assert len(dropped.done) == 2 and await inbox.list() == []
        assert [a.offset for a in await audits(y.stream("/b", T), "discarded")] == [
            d.audit_offset for d in dropped.done]
        with pytest.raises(errors.InvalidInput):
            await inbox.discard_all("x", colour="red")


async def test_the_oldest_dead_letters_are_counted_first(fresh_url: str, tmp_path) -> None:
    """The metrics read at most so many dead letters' times: the oldest, so
    the oldest-age gauge never misses the oldest."""
    seen: list = []
    async with yoke.open(fresh_url, app=actor_app(seen), data_dir=str(tmp_path)) as y:
        inbox = y.failures(T)
        await y.instances(T).create("orders", key="k")
        await y.stream("/a", T).append_many([{"type": "order", "payload": {"n": n, "poison": True}} for n in (1, 2)])
        await y.wait_idle(timeout_s=10)
        first = next(f for f in await inbox.list() if f.offset == 1)
        await inbox.replay(first.id)  # it dies again: the first row is now the newest
        await until(inbox.list, lambda fs: fs and fs[-1].id == first.id and fs[-1].failed_at > first.failed_at)
        listed = await inbox.list()
        assert await y.store.actors.dead_letter_times(T, 1) == [listed[0].failed_at]
        assert await y.store.actors.dead_letter_times(T, 10) == [f.failed_at for f in listed]


def receiving_app(fail: set, seen: list, name: str = "rec") -> yoke.App:
    app = yoke.App()

    @app.receiver(name)
    async def receive(batch: dict) -> None:
        for e in batch["events"]:
            if poisoned(e) or e["offset"] in fail:
                raise RuntimeError(f"cannot take offset {e['offset']}")
        seen.extend((e["offset"], e["payload"]) for e in batch["events"])

    return app


async def test_halted_subscription_replayed_as_is_resumes_it(fresh_url: str) -> None:
    seen: list = []
    fail = {2}
    async with yoke.open(fresh_url, app=receiving_app(fail, seen), **FAST) as y:
        s = y.stream("/s", T)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x", "payload": {"n": n}} for n in (1, 2, 3)])  # offsets 2..4
        await until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        inbox = y.failures(T)
        [f] = await inbox.list()
        assert (f.kind, f.receiver, f.path, f.subscription, f.offset) == ("halted", "call", "/s", "rec", 2)
        assert f.id.startswith("ht_") and f.attempt_count == 15 and "cannot take offset 2" in f.error
        assert [a.number for a in f.attempts] == list(range(1, 16))
        assert all("cannot take offset 2" in a.error and a.at for a in f.attempts)
        assert f.event["payload"] == {"n": 1} and await inbox.get(f.id) == f
        assert await inbox.list(kind="halted", subscription="rec", stream="/s") == [f]
        assert await inbox.list(subscription="other") == [] and await inbox.list(actor="a") == []
        fail.clear()
        done = await inbox.replay(f.id)
        status = await s.wait_until_processed("rec", 4, timeout_s=10)
        assert status.halted is None and [o for o, _ in seen] == [2, 3, 4]
        events = await s.read(after=4)  # 5: the halt
        assert [e.type for e in events] == [
            "yoke.subscription.halted", "yoke.subscription.resumed", "yoke.failure.replayed"]
        assert events[2].offset == done.audit_offset and events[2].payload["failure"] == f.id
        assert await inbox.list() == []
        with pytest.raises(errors.FailureNotFound):
            await inbox.replay(f.id)


async def test_halted_subscription_replayed_corrected_and_discarded(fresh_url: str) -> None:
    seen: list = []
    async with yoke.open(fresh_url, app=receiving_app(set(), seen), **FAST) as y:
        s = y.stream("/s", T)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x", "payload": {"n": 1, "poison": True}}, {"type": "x", "payload": {"n": 2}}])
        await until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        inbox = y.failures(T)
        [f] = await inbox.list()
        done = await inbox.replay(f.id, {"payload": {"n": 1}})
        assert done.delivered
        await s.wait_until_processed("rec", 3, timeout_s=10)
        assert seen == [(2, {"n": 1}), (3, {"n": 2})]  # the corrected event once, then on
        assert (await s.get(2)).payload == {"n": 1, "poison": True}
        # A second poisoned event halts it again; discard steps over it.
        poison = await s.append({"type": "x", "payload": {"n": 3, "poison": True}})
        await s.append({"type": "x", "payload": {"n": 4}})
        await until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        [g] = await inbox.list()
        assert g.offset == poison.offset and g.id != f.id
        await inbox.discard(g.id, "test order")
        await until(lambda: s.subscription("rec"), lambda st: st.processed_through_offset >= poison.offset + 1)
        assert [p for _, p in seen] == [{"n": 1}, {"n": 2}, {"n": 4}]
        [audit] = [e for e in await s.read(limit=100) if e.type == "yoke.failure.discarded"]
        assert audit.payload["reason"] == "test order" and audit.payload["kind"] == "halted"


async def test_skipped_event_replayed_to_that_subscription_only(fresh_url: str) -> None:
    seen: list = []
    others: list = []
    app = receiving_app(set(), seen)

    @app.receiver("other")
    async def other(batch: dict) -> None:
        others.extend(e["offset"] for e in batch["events"])

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s", T)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning",
                          on_failing_event="skip")
        await s.subscribe("other", yoke.call("other"), filter={"types": ["x"]}, start="beginning")
        sent = await s.append_many([
            {"type": "x", "payload": {"n": 1, "poison": True}}, {"type": "x", "payload": {"n": 2}},
            {"type": "x", "payload": {"n": 3, "poison": True}},
        ])
        await s.wait_until_processed("rec", sent[-1].offset, timeout_s=10)
        await s.wait_until_processed("other", sent[-1].offset, timeout_s=10)
        inbox = y.failures(T)
        skipped = await inbox.list(kind="skipped")
        assert [f.offset for f in skipped] == [sent[0].offset, sent[2].offset]
        f = skipped[0]
        assert f.id.startswith("sk_") and f.subscription == "rec" and f.receiver == "call"
        assert f.attempt_count == 3 and "cannot take" in f.error and f.event["payload"]["n"] == 1
        assert [a.number for a in f.attempts] == [1, 2, 3] and all("cannot take" in a.error for a in f.attempts)
        assert await inbox.get(f.id) == f
        done = await inbox.replay(f.id, {"payload": {"n": 1}})
        assert done.delivered and seen[-1] == (sent[0].offset, {"n": 1})
        assert sorted(others) == [e.offset for e in sent]  # the other subscription got nothing more
        with pytest.raises(errors.FailureNotFound):
            await inbox.get(f.id)
        # As it is, still poisoned: the receiver fails it and it stays open.
        with pytest.raises(errors.ReplayFailed):
            await inbox.replay(skipped[1].id)
        assert [x.id for x in await inbox.list()] == [skipped[1].id]
        await inbox.discard(skipped[1].id, "bad data")
        assert await inbox.list() == []
        kinds = [e.type for e in await s.read(limit=100) if e.type.startswith("yoke.failure.")]
        assert kinds == ["yoke.failure.replayed", "yoke.failure.discarded"]


async def test_ids_and_input_are_checked(y) -> None:  # noqa: ANN001
    inbox = y.failures(T)
    for bad in ("", "dl_", "xx_abc", "dl_!!!", "ht_WzFd", 7):
        with pytest.raises(errors.FailureNotFound):
            await inbox.get(bad)
    with pytest.raises(errors.FailureNotFound):
        await inbox.get("dl_WzEyMzQ1XQ")  # well formed, names nothing
    with pytest.raises(errors.InvalidInput):
        await inbox.list(kind="lost")
    with pytest.raises(errors.InvalidInput):
        await inbox.list(limit=0)
    with pytest.raises(errors.InvalidInput):
        await inbox.discard("dl_WzEyMzQ1XQ", "")
    with pytest.raises(errors.InvalidInput):
        await inbox.replay("dl_WzEyMzQ1XQ", {"offset": 3})
    with pytest.raises(errors.ReservedEventType):
        await inbox.replay("dl_WzEyMzQ1XQ", {"type": "yoke.nope"})
    # Outside what the stores hold: refused by name before any SQL (was
    # OverflowError on SQLite, DataError on PostgreSQL).
    for bounds in ({"since": 2**63}, {"until": 10**40}, {"since": -1}):
        with pytest.raises(errors.InvalidInput) as refused:
            await inbox.list(**bounds)
        assert refused.value.details["field"] in bounds
        with pytest.raises(errors.InvalidInput):
            await inbox.discard_all("x", **bounds)
    # A path with NUL (PostgreSQL cannot take it as text) names no failure.
    with pytest.raises(errors.FailureNotFound):
        await inbox.get("ht_WyIvYVx1MDAwMGIiLCJzIiwxXQ")


async def test_a_processor_halt_is_replayed_as_is_never_corrected(fresh_url: str) -> None:
    app = yoke.App()
    broken = {"on": True}

    @app.processor("total")
    class Total:
        version = "1"

        def initial_state(self) -> dict:
            return {"sum": 0}

        def reduce(self, state: dict, event) -> dict:  # noqa: ANN001
            if broken["on"] and poisoned(event.to_dict()):
                raise ValueError("cannot add poison")
            return {"sum": state["sum"] + event.payload.get("n", 0)}

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/ledger", T)
        await s.subscribe("total", yoke.processor("total"), start="beginning")
        await s.append_many([{"type": "x", "payload": {"n": 1}}, {"type": "x", "payload": {"n": 2, "poison": True}}])
        await until(lambda: s.subscription("total"), lambda st: st.halted is not None)
        inbox = y.failures(T)
        [f] = await inbox.list(receiver="processor")
        assert f.kind == "halted" and f.event["payload"] == {"n": 2, "poison": True}
        with pytest.raises(errors.FailureNotReplayable):
            await inbox.replay(f.id, {"payload": {"n": 2}})
        assert [x.id for x in await inbox.list()] == [f.id]  # left as it was
        broken["on"] = False
        await inbox.replay(f.id)
        status = await s.wait_until_processed("total", 3, timeout_s=10)
        assert status.halted is None and await inbox.list() == []


async def test_a_corrected_replay_repeats_no_effect_the_failed_runs_committed(fresh_url: str, tmp_path) -> None:
    """The dead row keeps its effects journal (docs/advanced/effects.md): the replayed
    run's identical append returns the recorded one, nothing is appended twice."""
    app = yoke.App()

    @app.actor("billing", filter=Filter(types=["order"]), max_attempts=2, retry_base_s=0.01, retry_max_s=0.02)
    async def billing(ctx, event):
        await ctx.append({"type": "invoice", "payload": {"order": event.payload["order"]}}, "/invoices")
        if poisoned(event.to_dict()):
            raise ValueError("cannot charge")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("billing", key="k")
        await y.stream("/orders", T).append({"type": "order", "payload": {"order": "A-1", "poison": True}})
        await y.wait_idle(timeout_s=10)
        [f] = await y.failures(T).list()
        await y.failures(T).replay(f.id, {"payload": {"order": "A-1"}})
        await y.wait_idle(timeout_s=10)
        invoices = [e.payload for e in await y.stream("/invoices", T).read()]
        assert invoices == [{"order": "A-1"}]
        assert await y.failures(T).list() == []


async def test_a_patched_replay_changes_what_the_patch_names_and_keeps_the_rest(fresh_url: str, tmp_path) -> None:
    """``patch`` is a JSON Merge Patch of the failed event: the fields and
    members it names change (``None`` removes one), everything else stays
    the original's; by filter, each failure's own event is patched."""
    got: list = []
    app = yoke.App()

    @app.actor("bills", filter=Filter(types=["bill"]), max_attempts=1)
    async def bills(ctx, event):
        if poisoned(event.to_dict()):
            raise ValueError("poisoned")
        got.append((event.type, event.payload, event.metadata))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inbox = y.failures(T)
        await y.instances(T).create("bills", key="k")
        s = y.stream("/bills", T)
        original = {"customer": "c1", "lines": [{"sku": "a", "qty": 2}], "amount": 10, "poison": True}
        await s.append({"type": "bill", "payload": original, "metadata": {"via": "portal", "trace": "t1"}})
        await y.wait_idle(timeout_s=10)
        [failure] = await inbox.list()

        with pytest.raises(errors.InvalidInput):  # one correction or the other
            await inbox.replay(failure.id, {"payload": {}}, patch={"payload": {}})
        for bad in ({}, {"offset": 3}, {"metadata": "x"}, [1]):
            with pytest.raises(errors.InvalidInput):
                await inbox.replay(failure.id, patch=bad)
        with pytest.raises(errors.InvalidInput):  # checked as made: an event needs its type
            await inbox.replay(failure.id, patch={"type": None})
        with pytest.raises(errors.ReservedEventType):
            await inbox.replay(failure.id, patch={"type": "yoke.bill"})
        assert [f.id for f in await inbox.list()] == [failure.id]  # refused: still open, untouched

        await inbox.replay(failure.id, patch={"payload": {"poison": None, "amount": 12}, "metadata": {"trace": None}})
        await y.wait_idle(timeout_s=10)
        assert got == [("bill", {"customer": "c1", "lines": [{"sku": "a", "qty": 2}], "amount": 12},
                        {"via": "portal"})]
        [audit] = await audits(s, "replayed")
        assert audit.payload["corrected"] == {
            "payload": {"customer": "c1", "lines": [{"sku": "a", "qty": 2}], "amount": 12}, "metadata": {"via": "portal"}}
        assert (await s.get(1)).payload == original  # history untouched

        # By filter: each failure's own event, patched the same way.
        got.clear()
        await s.append_many([{"type": "bill", "payload": {"n": n, "poison": True}} for n in (1, 2)])
        await y.wait_idle(timeout_s=10)
        bulk = await inbox.replay_all(stream="/bills", patch={"payload": {"poison": None}})
        assert len(bulk.done) == 2 and bulk.failed == []
        await y.wait_idle(timeout_s=10)
        assert sorted(p["n"] for _, p, _ in got) == [1, 2] and all("poison" not in p for _, p, _ in got)
        with pytest.raises(errors.InvalidInput):
            await inbox.replay_all(stream="/bills", patch={"offset": 1})
        # A patch that makes an invalid event of a failure: reported, the failure left open.
        await s.append({"type": "bill", "payload": {"n": 3, "poison": True}})
        await y.wait_idle(timeout_s=10)
        [open_one] = await inbox.list()
        bulk = await inbox.replay_all(stream="/bills", patch={"type": None})
        assert bulk.done == [] and [fid for fid, _ in bulk.failed] == [open_one.id]
        assert isinstance(bulk.failed[0][1], errors.InvalidInput)  # the event needs its type
        assert [f.id for f in await inbox.list()] == [open_one.id]
