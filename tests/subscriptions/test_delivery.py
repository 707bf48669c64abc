"""Delivery: the cursor, batches, retries, skips, halts, deployment resume,
late acknowledgements, leases and takeover (``call`` receivers)."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors
from yoke.subscriptions.runner import MAX_ATTEMPTS

from .common import FAST, control_events
from .common import until as _until


def recording_app(version: str | None = None, *, fail_on=(), name: str = "rec") -> tuple[yoke.App, list]:  # noqa: ANN001
    """An app whose receiver records every batch and fails any batch
    holding an offset in ``fail_on``."""
    app = yoke.App(version=version)
    batches: list[dict] = []

    @app.receiver(name)
    async def receive(batch: dict) -> None:
        batches.append(batch)
        offsets = {e["offset"] for e in batch["events"]}
        if offsets & set(fail_on):
            raise RuntimeError(f"poison in {sorted(offsets & set(fail_on))}")

    return app, batches


def delivered(batches: list, *, ok_only_of=None) -> list[int]:  # noqa: ANN001
    return [e["offset"] for b in batches for e in b["events"]]


async def test_batches_filter_ephemeral_and_cursor(fresh_url: str) -> None:
    app, batches = recording_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]})
        await s.append_many([{"type": "x", "payload": {"i": i}} for i in range(2500)])
        await s.append({"type": "y"})  # not matching: still advances the cursor
        last = await s.append({"type": "x", "ephemeral": True})  # never delivered
        status = await s.wait_until_processed("rec", last.offset, timeout_s=20)
        assert status.processed_through_offset == last.offset and status.lag == 0
        offsets = delivered(batches)
        assert offsets == list(range(2, 2502))  # in order, each once, no ephemeral
        assert max(len(b["events"]) for b in batches) <= 1000
        first = batches[0]
        assert set(first) == {
            "events", "path", "name", "stream_id", "stream_created_at", "generation", "attempt", "delivery_id",
        }
        assert (first["path"], first["name"], first["attempt"]) == ("/s", "rec", 1)
        info = await s.info()
        # The run: the source lifetime and the configuration generation.
        assert (first["stream_id"], first["stream_created_at"], first["generation"]) == (
            info.stream_id, info.created_at, (await s.subscription("rec")).generation)
        assert status.delivered == 2500


async def test_batches_stay_under_one_mebibyte(fresh_url: str) -> None:
    app, batches = recording_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"))
        big = "x" * 60_000
        results = await s.append_many([{"type": "x", "payload": {"b": big}} for _ in range(40)])
        await s.wait_until_processed("rec", results[-1].offset, timeout_s=20)
        assert len(batches) >= 3
        for b in batches:
            assert sum(len(e["payload"]["b"]) for e in b["events"]) <= 1024 * 1024


async def test_start_beginning_delivers_history_and_now_does_not(fresh_url: str) -> None:
    app, batches = recording_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.append_many([{"type": "x"}] * 3)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.wait_until_processed("rec", (await s.info()).head, timeout_s=10)
        assert delivered(batches) == [1, 2, 3]
        batches.clear()
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="now")  # a new run
        extra = await s.append({"type": "x"})
        await s.wait_until_processed("rec", extra.offset, timeout_s=10)
        assert delivered(batches) == [extra.offset]


async def test_poison_event_is_isolated_and_halts_after_the_ladder(fresh_url: str) -> None:
    app, batches = recording_app("v1", fail_on=(5,))
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x"}] * 8)  # offsets 2..9, poison at 5
        halted = await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        # The healthy prefix was delivered; the failing batch shrank to one event.
        assert halted.processed_through_offset == 4
        ok = [b for b in batches if 5 not in {e["offset"] for e in b["events"]}]
        assert delivered(ok) == [2, 3, 4]
        assert [len(b["events"]) for b in batches[-(MAX_ATTEMPTS - 1):]] == [1] * (MAX_ATTEMPTS - 1)
        assert [b["attempt"] for b in batches if b["events"][0]["offset"] == 5][-1] == MAX_ATTEMPTS
        assert halted.halted["offset"] == 5 and halted.halted["attempts"] == MAX_ATTEMPTS
        assert "poison" in halted.halted["error"] and halted.halted["version"] == "v1"
        [event] = [e for e in await control_events(s) if e.type == "yoke.subscription.halted"]
        assert event.payload == {
            "name": "rec", "offset": 5, "attempts": MAX_ATTEMPTS, "error": halted.halted["error"],
            "version": "v1",
        }
        assert halted.failures == MAX_ATTEMPTS and halted.last_error == halted.halted["error"]


async def test_skip_mode_skips_a_poison_event_with_an_audit_line(fresh_url: str) -> None:
    app, batches = recording_app(fail_on=(4,))
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe(
            "rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning", on_failing_event="skip"
        )
        results = await s.append_many([{"type": "x"}] * 5)  # offsets 2..6, poison at 4
        status = await s.wait_until_processed("rec", results[-1].offset, timeout_s=10)
        attempts_at_4 = [b["attempt"] for b in batches if b["events"] == [e for e in b["events"] if e["offset"] == 4]]
        assert attempts_at_4[-1] == 3
        ok = [b for b in batches if 4 not in {e["offset"] for e in b["events"]}]
        assert sorted(set(delivered(ok))) == [2, 3, 5, 6]
        [audit] = [e for e in await s.read() if e.type == "yoke.error"]
        assert audit.payload["kind"] == "subscription_event_skipped"
        assert (audit.payload["name"], audit.payload["offset"], audit.payload["attempts"]) == ("rec", 4, 3)
        assert status.halted is None


async def test_three_failing_events_in_a_row_halt_instead_of_mass_skipping(fresh_url: str) -> None:
    app, _ = recording_app(fail_on=(2, 3, 4, 5))
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe(
            "rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning", on_failing_event="skip"
        )
        await s.append_many([{"type": "x"}] * 4)  # offsets 2..5 all fail
        halted = await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        skipped = [e.payload["offset"] for e in await s.read() if e.type == "yoke.error"]
        assert skipped == [2, 3] and halted.halted["offset"] == 4
        assert halted.processed_through_offset == 3


async def test_halt_resumes_once_under_a_new_deployment_version(fresh_url: str) -> None:
    broken, _ = recording_app("v1", fail_on=(2,))
    async with yoke.open(fresh_url, app=broken, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append({"type": "x"})
        await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
    # The same broken version never resumes by itself.
    async with yoke.open(fresh_url, app=broken, **FAST) as y:
        s = y.stream("/s")
        await y.deliveries.sweep()
        assert (await s.subscription("rec")).halted is not None
    # Two processes of the fixed deployment: exactly one resumed event.
    fixed_a, got_a = recording_app("v2")
    fixed_b, got_b = recording_app("v2")
    async with yoke.open(fresh_url, app=fixed_a, **FAST) as ya, yoke.open(fresh_url, app=fixed_b, **FAST) as yb:
        s = ya.stream("/s")
        await s.wait_until_processed("rec", 2, timeout_s=10)
        await asyncio.gather(ya.deliveries.sweep(), yb.deliveries.sweep())
        resumed = [e for e in await control_events(s) if e.type == "yoke.subscription.resumed"]
        assert [e.payload for e in resumed] == [{"name": "rec", "reason": "deploy", "version": "v2"}]
        assert delivered(got_a + got_b) == [2]


async def test_operator_resume_and_set_cursor_and_resume(fresh_url: str) -> None:
    failing = {2}
    app = yoke.App(version="v1")
    seen: list[int] = []

    @app.receiver("rec")
    async def receive(batch: dict) -> None:
        offsets = [e["offset"] for e in batch["events"]]
        if failing & set(offsets):
            raise RuntimeError("not yet")
        seen.extend(offsets)

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x"}] * 2)
        await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        failing.clear()
        resumed = await s.resume("rec")
        assert resumed.halted is None and resumed.attempts == 0
        await s.wait_until_processed("rec", 3, timeout_s=10)
        assert seen == [2, 3]
        failing.add(3)
        moved = await s.set_cursor("rec", 1)  # replay from 2; 3 fails again and halts
        await _until(lambda: s.subscription("rec"), lambda st: st.halted is not None)
        failing.clear()
        status = await s.set_cursor_and_resume("rec", 2)
        assert status.halted is None and status.generation > moved.generation
        await s.wait_until_processed("rec", 3, timeout_s=10)
        assert seen == [2, 3, 2, 3]
        types = [e.type for e in await control_events(s)]
        assert types[-2:] == ["yoke.subscription.cursor_set", "yoke.subscription.resumed"]


async def test_due_retry_runs_while_the_source_is_quiet(fresh_url: str) -> None:
    app, batches = recording_app()
    calls = {"n": 0}

    @app.receiver("flaky")
    async def flaky(batch: dict) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first attempt fails")

    async with yoke.open(fresh_url, app=app, **{**FAST, "subscription_retry_base_s": 0.2}) as y:
        s = y.stream("/s")
        await s.subscribe("flaky", yoke.call("flaky"), filter={"types": ["x"]}, start="beginning")
        last = await s.append({"type": "x"})  # nothing is appended after this
        status = await s.wait_until_processed("flaky", last.offset, timeout_s=10)
        assert calls["n"] == 2 and status.attempts == 0 and "first attempt fails" in status.last_error


async def test_retry_ladder_doubles_with_jitter_the_same_for_the_same_retry() -> None:
    from yoke.clock import backoff_s

    for attempt, nominal in [(1, 1), (2, 2), (3, 4), (11, 1024), (12, 1800), (15, 1800)]:
        samples = [backoff_s(attempt, 1.0, 1800.0, "default", "/s", f"sub{n}", 7) for n in range(200)]
        assert nominal * 0.8 <= min(samples) and max(samples) <= nominal * 1.2
        assert max(samples) - min(samples) > nominal * 0.1  # jittered across subscriptions
        # ... and repeatable for one (a run under a test's clock is).
        assert backoff_s(attempt, 1.0, 1800.0, "default", "/s", "sub3", 7) == samples[3]


async def test_late_acknowledgement_after_set_cursor_is_discarded(fresh_url: str) -> None:
    app = yoke.App()
    entered = asyncio.Event()
    release = asyncio.Event()
    calls: list[list[int]] = []

    @app.receiver("slow")
    async def slow(batch: dict) -> None:
        calls.append([e["offset"] for e in batch["events"]])
        if len(calls) <= 2:
            entered.set()
            await release.wait()

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("slow", yoke.call("slow"), filter={"types": ["x"]}, start="beginning")
        await s.append_many([{"type": "x"}] * 3)  # 2..4
        await entered.wait()
        entered.clear()
        moved = await s.set_cursor("slow", 0)  # while the first send is in flight
        release.set()
        release.clear()
        await entered.wait()  # the second run has started: the first run's ack is gone
        status = await s.subscription("slow")
        assert status.generation == moved.generation
        assert status.processed_through_offset == 0  # the late ack did not move it
        release.set()
        await s.wait_until_processed("slow", 4, timeout_s=10)
        assert calls[:2] == [[2, 3, 4], [2, 3, 4]]
        stale = await y.store.subscriptions.ack("default", "/s", "slow", moved.generation - 1, 99, 1, 0)
        head = (await s.info()).head
        assert stale is None and (await s.subscription("slow")).processed_through_offset == head


async def test_unsubscribe_stops_delivery(fresh_url: str) -> None:
    app, batches = recording_app()
    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]})
        first = await s.append({"type": "x"})
        await s.wait_until_processed("rec", first.offset, timeout_s=10)
        await s.unsubscribe("rec")
        await s.append({"type": "x"})
        await s.subscribe("probe", yoke.call("rec"), filter={"types": ["probe"]})
        probe = await s.append({"type": "probe"})
        await s.wait_until_processed("probe", probe.offset, timeout_s=10)
        assert delivered(batches) == [first.offset, probe.offset]


async def test_wait_until_processed_times_out_with_not_processed(fresh_url: str) -> None:
    app = yoke.App()
    gate = asyncio.Event()

    @app.receiver("stuck")
    async def stuck(batch: dict) -> None:
        await gate.wait()

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("stuck", yoke.call("stuck"))
        sent = await s.append({"type": "x"})
        with pytest.raises(errors.NotProcessed) as caught:
            await s.wait_until_processed("stuck", sent.offset, timeout_s=0.2)
        assert caught.value.details["processed_through_offset"] < sent.offset
        gate.set()
        await s.wait_until_processed("stuck", sent.offset, timeout_s=10)


async def test_one_process_delivers_a_subscription_and_another_takes_over(fresh_url: str) -> None:
    app_a, got_a = recording_app()
    app_b, got_b = recording_app()
    settings = {**FAST, "subscription_lease_s": 30.0}
    async with yoke.open(fresh_url, app=app_a, **settings) as ya:
        async with yoke.open(fresh_url, app=app_b, **settings) as yb:
            s = ya.stream("/s")
            await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]})
            await asyncio.gather(ya.deliveries.sweep(), yb.deliveries.sweep())
            results = await s.append_many([{"type": "x"}] * 20)
            await s.wait_until_processed("rec", results[-1].offset, timeout_s=10)
            assert bool(got_a) != bool(got_b)  # one holder
            holder, other = (ya, yb) if got_a else (yb, ya)
            assert (await s.subscription("rec")).delivering == holder.deliveries.owner
        # Whichever closed, the survivor (or the holder) keeps delivering from the cursor.
        more = await s.append({"type": "x"})
        await s.wait_until_processed("rec", more.offset, timeout_s=10)
        assert sorted(delivered(got_a + got_b)) == [r.offset for r in results] + [more.offset]


async def test_takeover_after_close_resumes_from_the_cursor(fresh_url: str) -> None:
    app_a, got_a = recording_app()
    app_b, got_b = recording_app()
    settings = {**FAST, "subscription_lease_s": 30.0}
    ya_cm = yoke.open(fresh_url, app=app_a, **settings)
    ya = await ya_cm.__aenter__()
    s = ya.stream("/s")
    await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]})
    first = await s.append({"type": "x"})
    await s.wait_until_processed("rec", first.offset, timeout_s=10)
    async with yoke.open(fresh_url, app=app_b, **settings) as yb:
        await yb.deliveries.sweep()  # it stays with a, or moves to b between two deliveries
        await ya_cm.__aexit__(None, None, None)  # gives up its leases
        await yb.deliveries.sweep()
        second = await yb.stream("/s").append({"type": "x"})
        await yb.stream("/s").wait_until_processed("rec", second.offset, timeout_s=10)
    assert delivered(got_a) == [first.offset] and delivered(got_b) == [second.offset]


async def test_call_and_processor_subscriptions_wait_for_a_process_that_registers_them(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as plain:  # no app: copies and webhooks only
        s = plain.stream("/s")
        await s.subscribe("rec", yoke.call("rec"))
        sent = await s.append({"type": "x"})
        await plain.deliveries.sweep()
        assert plain.deliveries._runners == {}
        assert (await s.subscription("rec")).delivering is None  # visible: nobody delivers it
        app, batches = recording_app()
        async with yoke.open(fresh_url, app=app, **FAST) as y:
            await y.stream("/s").wait_until_processed("rec", sent.offset, timeout_s=10)
        assert delivered(batches) == [sent.offset]


async def test_delivery_metrics(fresh_url: str, tenant: str) -> None:
    """The series of the subscriptions a process delivers, read from its
    runners at each scrape: the path only with metrics_path_labels."""
    from yoke import metrics

    app, _ = recording_app(fail_on=(3,))
    async with yoke.open(fresh_url, app=app, metrics_path_labels=True, **FAST) as y:
        s = y.stream("/m", tenant)
        await s.subscribe("rec", yoke.call("rec"), filter={"types": ["x"]}, on_failing_event="skip")
        results = await s.append_many([{"type": "x"}] * 3)
        await s.wait_until_processed("rec", results[-1].offset, timeout_s=10)
        labels = {"tenant": tenant, "path": "/m", "name": "rec"}
        assert _scraped(y, "yoke_subscription_delivered_total", labels) == 2
        assert _scraped(y, "yoke_subscription_failures_total", labels) == 3
        assert _scraped(y, "yoke_subscription_halted", labels) == 0
        # The lag is set just after the acknowledgement commits.
        await _until(lambda: _async(_scraped(y, "yoke_subscription_lag_offsets", labels)), lambda lag: lag == 0)
        await s.unsubscribe("rec")
        await y.deliveries.sweep()
        assert _scraped(y, "yoke_subscription_delivered_total", labels) is None  # gone with its subscription
    async with yoke.open(fresh_url, app=app, **FAST) as y:  # paths out of the labels (the default)
        await y.stream("/m", tenant).subscribe("rec", yoke.call("rec"), filter={"types": ["x"]})
        await y.deliveries.sweep()
        assert _scraped(y, "yoke_subscription_halted", {**labels, "path": ""}) == 0


def _scraped(y, name: str, labels: dict) -> float | None:  # noqa: ANN001
    from yoke import metrics

    y.exposition()  # refreshes the held subscriptions' series
    for family in metrics.SUBSCRIPTIONS.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def _async(value):  # noqa: ANN001, ANN202
    return value
