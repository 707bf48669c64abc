"""One poisoned event through every kind of failure, on both backends: an
actor handler raises (dead letter), a webhook answers 500 (a real receiver;
skipped), a copy's transform fails (halted). The inbox lists all three in
one place and the metrics count them; one corrected replay by filter fixes
them, and every receiver then holds each event exactly once."""

from __future__ import annotations

import yoke
from yoke import Filter, sampling
from tests.conftest import now_ms

from ..subscriptions.common import FAST, until
from ..subscriptions.webhook_server import Response, WebhookReceiver
from .app import POISON_COPY, poisoned

T = "journey"


def gauge(metric, *labels: str) -> float:  # noqa: ANN001
    """A sampled gauge's value; 0 when it has no such series (only values other than 0 have one)."""
    for family in metric.collect():
        for s in family.samples:
            if tuple(s.labels.values()) == labels:
                return s.value
    return 0


async def test_a_poisoned_event_through_every_kind_fixed_and_replayed_once(fresh_url: str, tmp_path) -> None:
    app = yoke.App()
    handled: list = []

    # Its own stream only: the copies in /archive are orders too.
    @app.actor("orders", filter=Filter(types=["order"], streams=["/orders"]), max_attempts=2, retry_base_s=0.01,
               retry_max_s=0.02)
    async def orders(ctx, event):
        if poisoned(event.payload):
            raise ValueError("poisoned order")
        handled.append((event.payload["n"], event.id))

    def answer(request):  # noqa: ANN001, ANN202
        return Response(500) if poisoned(request.event["payload"]) else Response(204)

    async with WebhookReceiver(answer) as hook, yoke.open(
        fresh_url, app=app, data_dir=str(tmp_path), **FAST
    ) as y:
        s = y.stream("/orders", T)
        await y.instances(T).create("orders", key="k")
        await s.subscribe("hook", yoke.webhook(hook.url), filter={"types": ["order"]}, start="beginning",
                          on_failing_event="skip")
        await s.subscribe("archive", yoke.copy_to_stream("/archive"), filter={"types": ["order"]},
                          transform=POISON_COPY, start="beginning")
        poison, good = await s.append_many([
            {"type": "order", "payload": {"n": 1, "poison": True}}, {"type": "order", "payload": {"n": 2}},
        ])
        inbox = y.failures(T)
        listed = await until(inbox.list, lambda fs: len(fs) == 3)
        assert {(f.kind, f.receiver) for f in listed} == {("dead_letter", "actor"), ("skipped", "webhook"),
                                                           ("halted", "copy")}
        assert {f.event["id"] for f in listed} == {poison.id} and {f.path for f in listed} == {"/orders"}
        failed_at = {f.kind: f.failed_at for f in listed}
        before = now_ms()
        await y.sampler().pass_once()
        after = now_ms()
        parked = (("dead_letter", "actor"), ("skipped", "webhook"), ("halted", "copy"))
        for kind, receiver in parked:
            assert gauge(sampling.FAILURES, T, kind, receiver, "under_1m") == 1
            assert gauge(sampling.FAILURES, T, kind, receiver, "over_1d") == 0
            # The age at the scrape (0 within the failure's own millisecond).
            oldest = gauge(sampling.FAILURE_OLDEST, T, kind)
            assert (before - failed_at[kind]) / 1000 <= oldest <= (after - failed_at[kind]) / 1000
        assert gauge(sampling.FAILURES, T, "halted", "webhook", "under_1m") == 0

        bulk = await inbox.replay_all(stream="/orders", event={"payload": {"n": 1}})
        assert len(bulk.done) == 3 and bulk.failed == []
        await y.wait_idle(timeout_s=10)
        await s.wait_until_processed("archive", good.offset, timeout_s=10)
        assert await inbox.list() == []

        # Nothing duplicated: each receiver holds each order once.
        assert sorted(n for n, _ in handled) == [1, 2]
        ok = [r for r in hook.requests if r.status == 204]
        assert sorted(r.event["payload"]["n"] for r in ok) == [1, 2]
        assert [r.event["source"]["replay_of"]["id"] for r in ok if r.event["payload"]["n"] == 1] == [poison.id]
        archived = [e for e in await y.stream("/archive", T).read() if e.type == "order"]
        assert [e.payload for e in archived] == [{"n": 1}, {"n": 2}]
        assert (await s.get(poison.offset)).payload == {"n": 1, "poison": True}  # history untouched
        audit = [e.payload["kind"] for e in await s.read(limit=100) if e.type == "yoke.failure.replayed"]
        assert sorted(audit) == ["dead_letter", "halted", "skipped"]

        await y.sampler().pass_once()
        for kind, receiver in parked:
            assert gauge(sampling.FAILURES, T, kind, receiver, "under_1m") == 0
            assert gauge(sampling.FAILURE_OLDEST, T, kind) == 0


async def test_a_process_without_deliveries_replays_a_skipped_webhook(fresh_url: str) -> None:
    """An API-only process (no executor, so no delivery engine) still makes
    the one delivery a replay needs, with an HTTP client of its own."""
    def answer(request):  # noqa: ANN001, ANN202
        return Response(500) if poisoned(request.event["payload"]) else Response(204)

    async with WebhookReceiver(answer) as hook:
        async with yoke.open(fresh_url, **FAST) as y:
            s = y.stream("/orders", T)
            await s.subscribe("hook", yoke.webhook(hook.url), filter={"types": ["order"]}, start="beginning",
                              on_failing_event="skip")
            sent = await s.append({"type": "order", "payload": {"n": 1, "poison": True}})
            await s.wait_until_processed("hook", sent.offset, timeout_s=10)
        async with yoke.open(fresh_url, executor=False) as api:
            assert api.deliveries is None
            [f] = await api.failures(T).list()
            assert (f.kind, f.receiver) == ("skipped", "webhook")
            done = await api.failures(T).replay(f.id, {"payload": {"n": 1}})
            assert done.delivered and await api.failures(T).list() == []
        ok = [r for r in hook.requests if r.status == 204]
        assert [r.event["payload"] for r in ok] == [{"n": 1}] and ok[0].offset == sent.offset
