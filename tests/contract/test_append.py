"""Append: the commit point, validation, atomic batches, closed streams."""

from __future__ import annotations

import pytest

import yoke
from yoke import errors


async def test_offsets_start_at_one_and_ascend(y, tenant):
    s = y.stream("/orders", tenant=tenant)
    results = [await s.append({"type": "order.placed", "payload": {"n": i}}) for i in range(5)]
    assert [r.offset for r in results] == [1, 2, 3, 4, 5]
    assert len({r.id for r in results}) == 5
    events = await s.read(after=0)
    assert [(e.offset, e.id, e.payload) for e in events] == [
        (r.offset, r.id, {"n": i}) for i, r in enumerate(results)
    ]


async def test_event_fields_round_trip(y, tenant):
    s = y.stream("/orders/eu", tenant=tenant)
    r = await s.append(
        {
            "type": "order.placed",
            "payload": [1, "two", {"three": 3.5}, None],
            "metadata": {"trace": "abc"},
            "source": {"app": "shop"},
            "correlation": "c-1",
            "priority": 7,
            "group_id": "g-1",
            "idempotency_key": "k-1",
        }
    )
    (event,) = await s.read()
    assert event == yoke.Event(
        offset=r.offset,
        id=r.id,
        at=event.at,
        type="order.placed",
        payload=[1, "two", {"three": 3.5}, None],
        metadata={"trace": "abc"},
        source={"app": "shop"},
        correlation="c-1",
        priority=7,
        group_id="g-1",
        idempotency_key="k-1",
        tenant=tenant,
        path="/orders/eu",
    )
    assert event.at > 1_700_000_000_000  # ms since epoch
    defaults = (await s.get((await s.append({"type": "bare"})).offset))
    assert (defaults.payload, defaults.metadata, defaults.source, defaults.priority) == ({}, {}, None, 0)


async def test_first_append_creates_stream_with_lifetime_id(y, tenant):
    s = y.stream("/new", tenant=tenant)
    with pytest.raises(errors.StreamNotFound) as exc:
        await s.info()
    assert exc.value.http_status == 404
    await s.append({"type": "x"})
    info = await s.info()
    assert info.stream_id.startswith("str_") and info.head == 1 and info.earliest == 1
    assert not info.closed and not info.legal_hold
    assert info.tenant == tenant and info.path == "/new" and info.created_at > 0
    other = await y.stream("/other", tenant=tenant).create(max_events=10)
    assert other.stream_id != info.stream_id and other.head == 0
    assert other.retention == yoke.Retention(max_age_s=None, max_events=10)
    # Creating again with the same definition returns the existing stream
    # unchanged; with another one it is stream_exists and nothing changes.
    assert await y.stream("/other", tenant=tenant).create(max_events=10) == other
    for different in ({}, {"max_events": 11}, {"metadata": {"a": 1}}, {"pinned": True}):
        with pytest.raises(errors.StreamExists) as exc:
            await y.stream("/other", tenant=tenant).create(**different)
        assert exc.value.http_status == 409
        assert exc.value.details["existing"]["retention"] == {"max_age_s": None, "max_events": 10}
    assert await y.stream("/other", tenant=tenant).info() == other


async def test_append_many_is_all_or_nothing(y, tenant):
    s = y.stream("/batch", tenant=tenant)
    await s.append({"type": "first"})
    with pytest.raises(errors.InvalidEventType):
        await s.append_many([{"type": "ok"}, {"type": "bad type!"}])
    await s.append({"type": "keyed", "idempotency_key": "k"})
    with pytest.raises(errors.IdempotencyConflict):
        await s.append_many([{"type": "ok2"}, {"type": "keyed", "payload": 1, "idempotency_key": "k"}])
    results = await s.append_many([{"type": "a"}, {"type": "b"}, {"type": "c"}])
    assert [r.offset for r in results] == [3, 4, 5]
    assert [e.type for e in await s.read()] == ["first", "keyed", "a", "b", "c"]


async def test_batches_of_every_insert_shape_read_back_in_order(y, tenant):
    # SQLite inserts a batch as multi-row statements of 64, 32, ... 1 rows.
    s = y.stream("/shapes", tenant=tenant)
    sizes = [1, 2, 3, 63, 64, 65, 100, 127, 200]
    expected = []
    for size in sizes:
        batch = [{"type": "shape", "payload": {"size": size, "i": i}, "group_id": f"g{i % 3}"} for i in range(size)]
        results = await s.append_many(batch)
        assert [r.offset for r in results] == list(range(len(expected) + 1, len(expected) + size + 1))
        expected += [(r.offset, r.id, b["payload"], b["group_id"]) for r, b in zip(results, batch)]
    events = await s.read(after=0, limit=len(expected))
    assert [(e.offset, e.id, e.payload, e.group_id) for e in events] == expected


async def test_closed_stream_rejects_appends_without_writing(y, tenant):
    s = y.stream("/closing", tenant=tenant)
    await s.append({"type": "x"})
    info = await s.close()
    assert info.closed
    with pytest.raises(errors.StreamClosed) as exc:
        await s.append({"type": "y"})
    assert (exc.value.code, exc.value.http_status) == ("stream_closed", 409)
    with pytest.raises(errors.StreamClosed):
        await s.append({"type": "y", "ephemeral": True})
    assert (await s.info()).head == 1
    assert [e.type for e in await s.read()] == ["x"]
    with pytest.raises(errors.StreamNotFound):
        await y.stream("/never", tenant=tenant).close()


async def test_retry_after_close_still_gets_the_original_result(y, tenant):
    s = y.stream("/closing-retry", tenant=tenant)
    first = await s.append({"type": "pay", "payload": 1, "idempotency_key": "p1"})
    await s.close()
    # The append happened before the close: its retry gets the original.
    assert await s.append({"type": "pay", "payload": 1, "idempotency_key": "p1"}) == first
    with pytest.raises(errors.StreamClosed):  # anything new is refused ...
        await s.append_many([{"type": "pay", "payload": 1, "idempotency_key": "p1"}, {"type": "new"}])
    with pytest.raises(errors.IdempotencyConflict):  # ... and a reused key still conflicts
        await s.append({"type": "pay", "payload": 2, "idempotency_key": "p1"})
    assert (await s.info()).head == 1


@pytest.mark.parametrize(
    ("event", "error", "code", "status"),
    [
        ({}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": ""}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": "x" * 257}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": "has space"}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": "star.*"}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": 5}, errors.InvalidEventType, "invalid_event_type", 400),
        ({"type": "a", "colour": "red"}, errors.UnknownEventField, "unknown_field", 400),
        ({"type": "yoke.subscription.configured"}, errors.ReservedEventType, "reserved_event_type", 400),
        ({"type": "a", "idempotency_key": ""}, errors.InvalidIdempotencyKey, "invalid_idempotency_key", 400),
        ({"type": "a", "idempotency_key": "k" * 257}, errors.InvalidIdempotencyKey, "invalid_idempotency_key", 400),
        ({"type": "a", "idempotency_key": 5}, errors.InvalidIdempotencyKey, "invalid_idempotency_key", 400),
        ({"type": "a", "ephemeral": True, "idempotency_key": "k"}, errors.EphemeralWithIdempotencyKey, "ephemeral_idempotency_key", 400),
        ({"type": "a", "payload": "x" * (64 * 1024)}, errors.EventTooLarge, "event_too_large", 413),
        ({"type": "a", "metadata": [1]}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "source": "me"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "source": {"copied_from": []}}, errors.ForgedSource, "forged_source", 400),
        ({"type": "a", "priority": "high"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "priority": True}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "priority": 2**40}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "ephemeral": "yes"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "correlation": 5}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "group_id": ""}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "payload": {1: "non-string key"}}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "payload": 2**70}, errors.InvalidEvent, "invalid_event", 400),
        ("not an object", errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "payload": "nul\x00"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "metadata": {"k\x00": 1}}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "correlation": "lone \udc00 surrogate"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "group_id": "g\x00"}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "payload": {"s": "\ud800"}}, errors.InvalidEvent, "invalid_event", 400),
        ({"type": "a", "idempotency_key": "k\x00"}, errors.InvalidIdempotencyKey, "invalid_idempotency_key", 400),
    ],
)
async def test_invalid_events_are_rejected_with_stable_codes(y, tenant, event, error, code, status):
    s = y.stream("/v", tenant=tenant)
    with pytest.raises(error) as exc:
        await s.append(event)
    assert isinstance(exc.value, yoke.YokeError)
    assert (exc.value.code, exc.value.http_status) == (code, status)
    assert exc.value.to_dict()["code"] == code
    # Nothing was written and no offset was taken.
    with pytest.raises(errors.StreamNotFound):
        await s.info()


async def test_event_at_the_size_limit_is_accepted(y, tenant):
    s = y.stream("/big", tenant=tenant)
    payload = "x" * (64 * 1024 - 200)
    r = await s.append({"type": "big", "payload": payload})
    assert (await s.get(r.offset)).payload == payload


async def test_allowed_type_charset(y, tenant):
    s = y.stream("/types", tenant=tenant)
    types = ["a", "order.placed", "events.example.com/github/webhook-received", "A-b_c:d@e+f", "x" * 256]
    await s.append_many([{"type": t} for t in types])
    assert [e.type for e in await s.read()] == types


@pytest.mark.parametrize(
    "path", ["", "orders", "/orders/", "//a", "/a//b", "/a/../b", "/a/-/b", "/-", "/a b", "/é", "/" + "a" * 600]
)
async def test_invalid_paths(y, path):
    with pytest.raises(errors.InvalidPath) as exc:
        y.stream(path)
    assert exc.value.http_status == 400


@pytest.mark.parametrize("tenant_name", ["", "a b", "a/b", "x" * 65, "t|x"])
async def test_invalid_tenants(y, tenant_name):
    with pytest.raises(errors.InvalidTenant):
        y.stream("/a", tenant=tenant_name)


async def test_root_stream_is_the_tenants_global_stream(y, tenant):
    r = await y.stream("/", tenant=tenant).append({"type": "hello"})
    assert r.offset == 1
    assert [s.path for s in await y.streams(tenant=tenant)] == ["/"]
    # Streams are independent logs with their own offsets.
    assert (await y.stream("/a", tenant=tenant).append({"type": "x"})).offset == 1


async def test_list_streams_by_prefix(y, tenant):
    for path in ["/orders/eu", "/orders/us", "/orders_archive", "/users/1", "/Orders"]:
        await y.stream(path, tenant=tenant).append({"type": "x"})
    listed = await y.streams(tenant=tenant, prefix="/orders/")
    assert [s.path for s in listed] == ["/orders/eu", "/orders/us"]
    assert [s.path for s in await y.streams(tenant=tenant, prefix="/orders")] == [
        "/orders/eu", "/orders/us", "/orders_archive",
    ]
    everything = await y.streams(tenant=tenant)
    # "/" holds the yoke.stream.created facts of the others.
    assert [s.path for s in everything] == sorted(["/", "/orders/eu", "/orders/us", "/orders_archive", "/users/1", "/Orders"])
    page = await y.streams(tenant=tenant, limit=2, after="/orders/eu")
    assert [s.path for s in page] == ["/orders/us", "/orders_archive"]
    assert await y.streams(tenant="someone-else-" + tenant[:8]) == []


@pytest.mark.parametrize("prefix", ["/a\x00", "/\x00", "/" + "a" * 512, "a", 5])
async def test_list_streams_refuses_a_prefix_no_path_can_have(y, tenant, prefix):
    # PostgreSQL text cannot hold NUL: both backends refuse it the same way.
    with pytest.raises(errors.InvalidPath):
        await y.streams(tenant=tenant, prefix=prefix)


async def test_trusted_appends_may_use_kernel_types(y, tenant):
    s = y.stream("/k", tenant=tenant)
    (r,) = await s._append([{"type": "yoke.audit", "source": {"copied_from": [1]}}], trusted=True)
    assert (await s.get(r.offset)).source == {"copied_from": [1]}


async def test_runtime_rejects_appends_after_close(db_url, tenant):
    async with yoke.open(db_url) as y:
        s = y.stream("/late", tenant=tenant)
        await s.append({"type": "x"})
    with pytest.raises(errors.RuntimeClosed) as exc:
        await s.append({"type": "y"})
    assert exc.value.http_status == 503


async def test_text_that_only_looks_like_nul_is_stored(y, tenant):
    s = y.stream("/lit", tenant=tenant)
    r = await s.append({"type": "a", "payload": "literal \\u0000 text", "correlation": "ünïcode ✓"})
    e = await s.get(r.offset)
    assert (e.payload, e.correlation) == ("literal \\u0000 text", "ünïcode ✓")


async def test_batch_size_is_capped(y, tenant):
    s = y.stream("/cap", tenant=tenant)
    with pytest.raises(errors.InvalidInput):
        await s.append_many([{"type": "x"}] * 10_001)
    with pytest.raises(errors.InvalidInput):
        await s.append_many({"type": "x"})  # a dict is not a list of events
    assert len(await s.append_many([{"type": "x"}] * 10_000)) == 10_000
