"""The lifetime fence with real deletion: a source deleted and created again
starts a new run; the old lifetime's subscriptions never deliver again, and
a late batch of theirs lands nowhere."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke.subscriptions import copies as copy
from yoke.subscriptions.runner import Batch

from .common import FAST, copying


async def test_a_delivery_in_flight_across_delete_and_recreate(fresh_url: str) -> None:
    """Process A is delivering a batch of the old lifetime when process B
    deletes the source, creates it again and configures a subscription of
    the same name (the same generation: both configure events are offset
    1). A's late acknowledgement must not move the new cursor, and A never
    sends the new lifetime's events to the old receiver."""
    app = yoke.App()
    entered, release = asyncio.Event(), asyncio.Event()
    old: list[dict] = []
    new: list[dict] = []

    @app.receiver("old")
    async def receive_old(batch: dict) -> None:
        old.append(batch)
        entered.set()
        await release.wait()

    @app.receiver("new")
    async def receive_new(batch: dict) -> None:
        new.append(batch)

    async with yoke.open(fresh_url, app=app, **FAST) as a, yoke.open(fresh_url, executor=False) as b:
        src_a, src_b = a.stream("/src"), b.stream("/src")
        first = await src_a.subscribe("sub", yoke.call("old"), filter={"types": ["x"]})
        await src_a.append_many([{"type": "x"}] * 3)  # 2..4
        await asyncio.wait_for(entered.wait(), 20)
        old_info = await src_b.info()

        await src_b.delete()
        again = await src_b.subscribe("sub", yoke.call("new"), filter={"types": ["x"]}, start="beginning")
        assert again.offset == first.offset == 1  # the same generation in both lifetimes
        await src_b.append_many([{"type": "x"}] * 3)  # 2..4 of the new stream
        new_info = await src_b.info()
        assert new_info.stream_id != old_info.stream_id

        release.set()
        status = await src_a.wait_until_processed("sub", 4, timeout_s=20)
        assert status.config["function"] == "new" and status.delivered == 3
        assert [[e["offset"] for e in b["events"]] for b in old] == [[2, 3, 4]]
        assert {b["stream_id"] for b in old} == {old_info.stream_id}
        # Every event of the new lifetime reached the new receiver (a late
        # acknowledgement landing on the new row would have skipped them).
        assert [e["offset"] for b in new for e in b["events"]] == [2, 3, 4]
        assert {b["stream_id"] for b in new} == {new_info.stream_id}
        await src_b.append({"type": "x"})
        await src_a.wait_until_processed("sub", 5, timeout_s=20)
        assert len(old) == 1 and [e["offset"] for b in new for e in b["events"]] == [2, 3, 4, 5]


async def test_a_late_copy_of_the_old_lifetime_is_fenced(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        src, dst = y.stream("/src"), y.stream("/dst")
        await src.subscribe("c", yoke.copy_to_stream("/dst"), filter={"types": ["x"]})
        await src.append({"type": "x", "payload": "old-1"})
        await src.wait_until_processed("c", 2, timeout_s=20)
        old_info = await src.info()
        old_events = await src.read()
        # A batch of the old run still in flight somewhere.
        late = Batch("default", "/src", "c", old_info.stream_id, old_info.created_at, 1, 1,
                     [e for e in old_events if e.type == "x"])

        await src.delete()
        await src.subscribe("c", yoke.copy_to_stream("/dst"), filter={"types": ["x"]})
        await src.append({"type": "x", "payload": "new-1"})
        await src.wait_until_processed("c", 2, timeout_s=20)
        new_info = await src.info()

        with pytest.raises(copy.Fenced):
            await copy.send(late, "/dst", copying(y))
        copies = [e for e in await dst.read() if e.type == "x"]
        assert [e.payload for e in copies] == ["old-1", "new-1"]
        hops = [e.source["copied_from"][-1] for e in copies]
        assert [(h["stream_id"], h["created_at"]) for h in hops] == [
            (old_info.stream_id, old_info.created_at), (new_info.stream_id, new_info.created_at),
        ]
        [record] = await y.store.subscriptions.inbound("default", "/dst")
        assert (record.source_stream_id, record.source_created_at) == (new_info.stream_id, new_info.created_at)


async def test_a_remote_webhook_receiver_fences_the_old_lifetime_by_its_stamps(fresh_url: str) -> None:
    """End to end over HTTP: a webhook receiver that keeps the newest
    (stream_created_at, generation) per (path, name) and refuses a strictly
    older stamp. Process A's POST of the old lifetime is held in the network
    while process B deletes the source, creates it again and subscribes
    anew, and process C (or A) delivers the new run; the late POST arrives
    after and is refused, and A's subscription of the old lifetime never
    runs again."""
    from .webhook_server import Response, WebhookReceiver

    secret = "whsec_" + "QUJD" * 8
    newest: dict[tuple[str, str], tuple[int, int]] = {}
    release = asyncio.Event()
    held: list[dict] = []

    async def respond(request) -> Response:  # noqa: ANN001
        body = request.json
        if not held:  # the first POST: held in the network
            held.append(body)
            await release.wait()
        key, stamp = (body["path"], body["name"]), (body["stream_created_at"], body["generation"])
        if key in newest and newest[key] > stamp:
            return Response(409)  # a superseded run
        newest[key] = max(newest.get(key, stamp), stamp)
        return Response(204)

    # The new run goes to A or C, whichever is its preferred process (A
    # starts it while its old lifetime's runner still waits for the POST).
    async with WebhookReceiver(respond) as hook:
        async with yoke.open(fresh_url, **FAST) as a, yoke.open(fresh_url, executor=False) as b:
            await a.stream("/src").subscribe("hook", yoke.webhook(hook.url, secret=secret))
            await a.stream("/src").append({"type": "x", "payload": "old"})
            await hook.wait_for(lambda requests: len(requests) == 1, timeout_s=20)
            old = await b.stream("/src").info()

            await b.stream("/src").delete()
            await b.stream("/src").subscribe("hook", yoke.webhook(hook.url, secret=secret))
            await b.stream("/src").append({"type": "x", "payload": "new"})
            async with yoke.open(fresh_url, **FAST) as c:
                status = await c.stream("/src").wait_until_processed("hook", 2, timeout_s=20)
                assert status.source_stream_id != old.stream_id
                release.set()
                await hook.wait_for(lambda requests: all(r.status is not None for r in requests), timeout_s=20)
                [late, fresh] = hook.requests
                assert (late.json["event"]["payload"], late.status) == ("old", 409)
                assert (fresh.json["event"]["payload"], fresh.status) == ("new", 204)
                assert (late.json["stream_id"], late.json["stream_created_at"]) == (old.stream_id, old.created_at)
                assert fresh.json["stream_created_at"] > old.created_at
                assert fresh.headers["yoke-stream-id"] == status.source_stream_id
                # A's runner of the old lifetime failed into nothing and stopped.
                await c.stream("/src").append({"type": "x", "payload": "later"})
                await c.stream("/src").wait_until_processed("hook", 3, timeout_s=20)
                after = await c.stream("/src").subscription("hook")
                assert (after.failures, after.attempts, after.state) == (0, 0, "running")
                assert [r.json["event"]["payload"] for r in hook.requests] == ["old", "new", "later"]
