"""Configuration lives in the log: control events, names, validation,
rebuilding the catalogue, operator commands on missing names."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors

from .common import FAST, control_events


async def test_subscribe_appends_configured_event_and_catalogue_matches(fresh_url: str) -> None:
    async with yoke.open(fresh_url, executor=False) as y:  # cursors as configured, not yet delivered
        a = y.stream("/a", "acme")
        await a.append({"type": "before"})
        sub = await a.subscribe(
            "to-b", yoke.copy_to_stream("/b"), filter={"types": ["x"]}, transform='{"payload": payload}'
        )
        assert sub.created and sub.offset == 2 and sub.name == "to-b" and sub.secret is None
        [configured] = await control_events(a)
        assert configured.type == "yoke.subscription.configured"
        assert configured.offset == 2 and configured.id == sub.id
        assert configured.payload == {
            "name": "to-b",
            "config": {
                "kind": "copy", "target": "/b", "filter": {"types": ["x"]},
                "transform": '{"payload": payload}', "start": "now", "on_failing_event": "halt",
            },
        }
        status = await a.subscription("to-b")
        assert status.config == configured.payload["config"]
        assert status.configured_at == status.generation == 2
        assert status.processed_through_offset == 2  # start="now": after the configure event
        beginning = await a.subscribe("b2", yoke.copy_to_stream("/c"), start="beginning")
        assert (await a.subscription(beginning.name)).processed_through_offset == 0


async def test_generated_names_and_reserved_namespace(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.append({"type": "x"})
        sub = await a.subscribe(None, yoke.copy_to_stream("/b"))
        assert sub.name == f"subscription:{sub.offset}" and sub.offset == 2
        head = (await a.info()).head
        for bad in ("subscription:7", "", "n" * 501, 5):
            with pytest.raises(errors.InvalidInput):
                await a.subscribe(bad, yoke.copy_to_stream("/b"))
        assert (await a.info()).head == head
        long_name = "n" * 500
        assert (await a.subscribe(long_name, yoke.copy_to_stream("/c"))).name == long_name


async def test_identical_configuration_returns_original_event_and_different_one_replaces(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        first = await a.subscribe("s", yoke.copy_to_stream("/b"), filter={"types": ["x"]})
        again = await a.subscribe("s", yoke.copy_to_stream("/b"), filter={"types": ["x"]})
        assert (again.offset, again.id, again.created, again.replaced) == (first.offset, first.id, False, False)
        assert first.created and not first.replaced
        assert (await a.info()).head == first.offset  # nothing appended
        replaced = await a.subscribe("s", yoke.copy_to_stream("/b"), filter={"types": ["y"]})
        assert replaced.created and replaced.replaced and replaced.offset == first.offset + 1
        status = await a.subscription("s")
        assert status.generation == replaced.offset and status.config["filter"] == {"types": ["y"]}
        assert len(await a.subscriptions()) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"receiver": yoke.copy_to_stream("/b"), "filter": {"where": "payload.("}}, errors.InvalidFilter, "JSONata"),
        ({"receiver": yoke.copy_to_stream("/b"), "transform": "{"}, errors.InvalidTransform, "JSONata"),
        ({"receiver": yoke.copy_to_stream("/a")}, errors.InvalidSubscription, "itself"),
        ({"receiver": yoke.copy_to_stream("/b"), "on_failing_event": "skip"}, errors.InvalidSubscription, "skip"),
        ({"receiver": yoke.processor("p"), "transform": "{}"}, errors.InvalidSubscription, "transform"),
        ({"receiver": yoke.copy_to_stream("/b"), "start": "later"}, errors.InvalidInput, "start"),
        ({"receiver": yoke.copy_to_stream("/b"), "on_failing_event": "retry"}, errors.InvalidInput, "on_failing"),
        ({"receiver": "/b"}, errors.InvalidInput, "receiver"),
        ({"receiver": yoke.copy_to_stream("/b"), "filter": {"types": ["x"], "key": "payload.k"}},
         errors.InvalidFilter, "types and where"),
    ],
)
async def test_invalid_configuration_appends_nothing(fresh_url: str, kwargs, error, text) -> None:  # noqa: ANN001
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.append({"type": "x"})
        kwargs = dict(kwargs)  # shared by both backends
        receiver = kwargs.pop("receiver")
        with pytest.raises(error) as caught:
            await a.subscribe("s", receiver, **kwargs)
        assert text in caught.value.message
        assert (await a.info()).head == 1
        assert await a.subscriptions() == []


def test_webhook_url_must_be_http() -> None:
    for url in ("ftp://example.com/x", "file:///etc/passwd", "http://", "example.com/hook"):
        with pytest.raises(errors.InvalidInput):
            yoke.webhook(url)
    with pytest.raises(errors.InvalidInput):
        yoke.webhook("https://example.com/hook", secret="not-a-secret")
    assert yoke.webhook("https://example.com/hook").secret.startswith("whsec_")


async def test_at_most_64_copy_subscriptions_into_one_stream(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        for i in range(64):
            await y.stream(f"/src/{i}").subscribe("fan-in", yoke.copy_to_stream("/sink"))
        extra = y.stream("/src/extra")
        with pytest.raises(errors.InvalidSubscription) as caught:
            await extra.subscribe("fan-in", yoke.copy_to_stream("/sink"))
        assert caught.value.details["limit"] == 64
        assert await extra.subscriptions() == []
        # Reconfiguring one of the 64 (same target) is not a 65th.
        replaced = await y.stream("/src/0").subscribe("fan-in", yoke.copy_to_stream("/sink"), filter={"types": ["x"]})
        assert replaced.created


async def test_concurrent_configures_never_pass_64_copies_into_one_stream(fresh_url: str) -> None:
    # The limit is counted in the configure's transaction, under a lock on the
    # target: concurrent configures from different sources cannot all see room.
    async with yoke.open(fresh_url, executor=False) as y:
        for i in range(60):
            await y.stream(f"/src/{i}").subscribe("fan-in", yoke.copy_to_stream("/sink"))
        racers = [y.stream(f"/racer/{i}") for i in range(12)]
        results = await asyncio.gather(
            *(r.subscribe("fan-in", yoke.copy_to_stream("/sink")) for r in racers), return_exceptions=True
        )
        refused = [r for r in results if isinstance(r, errors.InvalidSubscription)]
        assert len(refused) == 8 and all(r.details["limit"] == 64 for r in refused)
        assert all(not isinstance(r, BaseException) for r in results if r not in refused)
        copies = [s for src in (*[y.stream(f"/src/{i}") for i in range(60)], *racers) for s in await src.subscriptions()]
        assert len(copies) == 64


async def test_operator_commands_on_a_missing_name_append_nothing(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.append({"type": "x"})
        for command in (
            a.unsubscribe("nope"), a.resume("nope"), a.set_cursor("nope", 0),
            a.set_cursor_and_resume("nope", 0), a.subscription("nope"),
        ):
            with pytest.raises(errors.SubscriptionNotFound):
                await command
        assert (await a.info()).head == 1


async def test_operator_commands_are_control_events(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.subscribe("s", yoke.copy_to_stream("/b"))
        await a.append_many([{"type": "x"}] * 3)
        with pytest.raises(errors.InvalidCursor):
            await a.set_cursor("s", 99)
        moved = await a.set_cursor("s", 1)
        assert moved.processed_through_offset == 1 and moved.generation == 5
        await a.resume("s")  # not halted: nothing to do, nothing appended
        assert (await a.info()).head == 5
        await a.unsubscribe("s")
        assert [e.type for e in await control_events(a)] == [
            "yoke.subscription.configured", "yoke.subscription.cursor_set", "yoke.subscription.removed",
        ]
        cursor_set = (await control_events(a))[1]
        assert cursor_set.payload == {"name": "s", "after_offset": 1}
        assert await a.subscriptions() == []


async def test_catalogue_rebuilds_from_the_log_alone(fresh_url: str) -> None:
    # No delivery: the cursors stay where the operator put them.
    async with yoke.open(fresh_url, executor=False) as y:
        a = y.stream("/a", "acme")
        await a.subscribe("keep", yoke.copy_to_stream("/b"), filter={"types": ["x"]})
        await a.subscribe("gone", yoke.copy_to_stream("/c"))
        await a.subscribe(None, yoke.webhook("http://127.0.0.1:9/hook"))
        await a.append_many([{"type": "x"}] * 3)
        await a.set_cursor("keep", 2)
        await a.unsubscribe("gone")
        before = {s.name: s for s in await a.subscriptions()}
        head = (await a.info()).head
        assert not await y.store.subscriptions.write_catalogue("acme", "/a", head - 1, lambda rows: [])
        assert await a.subscriptions() != []  # a stale head writes nothing
        assert await y.store.subscriptions.write_catalogue("acme", "/a", head, lambda rows: [])
        assert await a.subscriptions() == []
        rebuilt = {s.name: s for s in await a.rebuild_subscriptions()}
        assert set(rebuilt) == set(before)
        for name, status in rebuilt.items():
            old = before[name]
            assert (status.config, status.configured_at, status.generation, status.halted) == (
                old.config, old.configured_at, old.generation, old.halted,
            )
        assert rebuilt["keep"].processed_through_offset == 2


async def test_received_control_events_are_data(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe("mirror", yoke.copy_to_stream("/b"))
        other = await a.subscribe("other", yoke.copy_to_stream("/c"))
        await a.unsubscribe("other")
        await a.wait_until_processed("mirror", (await a.info()).head, timeout_s=10)
        copied = [e for e in await b.read() if e.type.startswith("yoke.subscription.")]
        assert [e.type for e in copied] == ["yoke.subscription.configured", "yoke.subscription.removed"]
        assert copied[0].payload["name"] == "other" and copied[0].source["copied_from"][0]["offset"] == other.offset
        assert await b.subscriptions() == []
        assert await b.rebuild_subscriptions() == []  # a rebuild ignores received copies too


async def test_public_appends_cannot_forge_kernel_events(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        with pytest.raises(errors.ReservedEventType):
            await a.append({"type": "yoke.subscription.configured", "payload": {"name": "x"}})
        with pytest.raises(errors.ForgedSource):
            await a.append({"type": "x", "source": {"copied_from": [{"path": "/z"}]}})
        assert await y.streams() == []  # nothing was appended, not even the stream


async def test_a_closed_or_full_source_still_takes_subscription_bookkeeping(fresh_url: str) -> None:
    from yoke.store.contract import Limits

    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.subscribe("s", yoke.webhook("http://127.0.0.1:9/closed-port"))
        await a.append({"type": "x"})
        await a.set_limits(Limits(max_total_events=2))
        with pytest.raises(errors.QuotaExhausted):
            await a.append({"type": "x"})
        await a.close()
        # The receiver never answers: the ladder ends in a halted event all the same.
        async with asyncio.timeout(15):
            while (halted := await a.subscription("s")).halted is None:
                await asyncio.sleep(0.02)
        assert halted.halted["offset"] == 2 and halted.attempts == 15
        moved = await a.set_cursor_and_resume("s", 2)
        assert moved.halted is None
        await a.unsubscribe("s")
        assert [e.type for e in await control_events(a)][-3:] == [
            "yoke.subscription.cursor_set", "yoke.subscription.resumed", "yoke.subscription.removed",
        ]
        with pytest.raises(errors.StreamClosed):
            await a.append({"type": "x"})  # still closed for everything else
        info = await a.info()
        assert info.closed and info.limits.max_total_events == 2


@pytest.mark.parametrize(
    "raw",
    [{"kind": {}}, {"kind": "webhook", "url": "http://[::1"}, {"kind": "webhook", "url": "http://h:99999/"},
     {"kind": "webhook", "url": "http://h/\x00"}, {"kind": "copy"}, {"kind": "copy", "target": 5}, []],
)
def test_receivers_from_json_refuse_bad_input(raw) -> None:  # noqa: ANN001
    from yoke.subscriptions.receivers import from_dict

    with pytest.raises(errors.InvalidInput):
        from_dict(raw)


async def test_rebuild_keeps_subscriptions_whose_configure_event_retention_removed(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.subscribe("old", yoke.copy_to_stream("/b"), filter={"types": ["x"]})
        await a.append_many([{"type": "x"}] * 5)
        await a.set_retention(max_events=2)
        assert await y.prune() > 0
        await a.subscribe("new", yoke.copy_to_stream("/c"), filter={"types": ["x"]})
        rebuilt = {s.name: s for s in await a.rebuild_subscriptions()}
        assert set(rebuilt) == {"old", "new"}
        assert rebuilt["old"].configured_at == 1


async def test_version_history_stops_flip_flopping_resumes(fresh_url: str) -> None:
    """v1 halts; v2 resumes once and halts too; v1 (still running somewhere)
    does not resume it again, and neither does an unversioned process."""
    def failing_app(version):  # noqa: ANN001, ANN202
        app = yoke.App(version=version)

        @app.receiver("r")
        async def receive(batch: dict) -> None:
            raise RuntimeError("still broken")

        return app

    async def halted_by(y, version: str):  # noqa: ANN001, ANN202
        s = y.stream("/s")
        async with asyncio.timeout(15):
            while True:
                status = await s.subscription("r")
                if status.halted is not None and status.halted["version"] == version:
                    return status
                await asyncio.sleep(0.02)

    async with yoke.open(fresh_url, app=failing_app("v1"), **FAST) as y1:
        s = y1.stream("/s")
        await s.subscribe("r", yoke.call("r"), filter={"types": ["x"]})
        await s.append({"type": "x"})
        await halted_by(y1, "v1")
    async with yoke.open(fresh_url, app=failing_app("v2"), **FAST) as y2:
        await halted_by(y2, "v2")
    async with yoke.open(fresh_url, app=failing_app("v1"), **FAST) as y1, \
            yoke.open(fresh_url, app=failing_app(None), **FAST) as y0:
        await asyncio.gather(y1.deliveries.sweep(), y0.deliveries.sweep())
        assert y1.deliveries._runners == {} and y0.deliveries._runners == {}
        resumed = [e for e in await control_events(y1.stream("/s")) if e.type == "yoke.subscription.resumed"]
        assert [e.payload["version"] for e in resumed] == ["v2"]


async def test_halt_error_is_cut_at_4096_characters(fresh_url: str) -> None:
    app = yoke.App(version="v1")

    @app.receiver("r")
    async def receive(batch: dict) -> None:
        raise RuntimeError("e" * 10_000)

    async with yoke.open(fresh_url, app=app, **FAST) as y:
        s = y.stream("/s")
        await s.subscribe("r", yoke.call("r"), filter={"types": ["x"]})
        await s.append({"type": "x"})
        async with asyncio.timeout(15):
            while (status := await s.subscription("r")).halted is None:
                await asyncio.sleep(0.02)
        assert len(status.halted["error"]) == 4096 and len(status.last_error) == 4096
        [event] = [e for e in await control_events(s) if e.type == "yoke.subscription.halted"]
        assert event.payload["error"] == status.halted["error"]


async def test_configuring_a_closed_source_is_refused(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a = y.stream("/a")
        await a.append({"type": "x"})
        await a.close()
        with pytest.raises(errors.StreamClosed):
            await a.subscribe("s", yoke.copy_to_stream("/b"))
        assert await a.subscriptions() == [] and (await a.info()).head == 1
