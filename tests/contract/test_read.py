"""Reads: the exact cursor rule, point reads, and a property test against a model."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yoke
from yoke import errors


async def test_cursor_rule(y, tenant):
    s = y.stream("/r", tenant=tenant)
    await s.append_many([{"type": "e", "payload": i} for i in range(1, 11)])
    assert [e.offset for e in await s.read(after=0, limit=3)] == [1, 2, 3]
    assert [e.offset for e in await s.read(after=7)] == [8, 9, 10]
    assert await s.read(after=10) == []
    with pytest.raises(errors.InvalidCursor) as exc:
        await s.read(after=11)
    assert (exc.value.code, exc.value.http_status) == ("invalid_cursor", 400)
    assert exc.value.details == {"requested": 11, "latest": 10}


async def test_missing_stream_reads_empty_but_rejects_future_cursor(y, tenant):
    # Python reads a stream never created as an empty one (a reader or a tail
    # may start before the first append); read_page says it does not exist,
    # which HTTP answers with 404 stream_not_found. get and info raise.
    s = y.stream("/nothing", tenant=tenant)
    assert await s.read() == []
    with pytest.raises(errors.InvalidCursor):
        await s.read(after=1)
    page = await s.read_page(after=5)
    assert (page.exists, page.events, page.head, page.closed) == (False, [], 0, False)
    with pytest.raises(errors.StreamNotFound):
        await s.get(1)
    with pytest.raises(errors.StreamNotFound):
        await s.info()
    await s.append({"type": "x"})
    page = await s.read_page()
    assert (page.exists, [e.offset for e in page.events], page.head, page.closed) == (True, [1], 1, False)
    await s.close()
    assert (await s.read_page(after=1)).closed


@pytest.mark.parametrize(
    "kwargs", [{"after": -1}, {"after": "3"}, {"after": True}, {"limit": 0}, {"limit": 10_001}, {"after": 2**63}]
)
async def test_invalid_read_arguments(y, tenant, kwargs):
    with pytest.raises(errors.InvalidInput) as exc:
        await y.stream("/r", tenant=tenant).read(**kwargs)
    assert exc.value.http_status == 400


async def test_point_read(y, tenant):
    s = y.stream("/p", tenant=tenant)
    r = await s.append({"type": "a", "payload": {"x": 1}})
    assert (await s.get(r.offset)).id == r.id
    with pytest.raises(errors.EventNotFound) as exc:
        await s.get(2)
    assert exc.value.http_status == 404
    with pytest.raises(errors.InvalidInput):
        await s.get(0)
    with pytest.raises(errors.InvalidInput):
        await s.get(2**64)


# --- property test: read(after=c) against a model ---------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.booleans(), min_size=1, max_size=5)),
        st.tuples(st.just("read"), st.integers(min_value=0, max_value=40), st.integers(1, 8)),
    ),
    min_size=1,
    max_size=25,
)


async def _run_model(url: str, tenant: str, ops) -> None:
    async with yoke.open(url) as y:
        s = y.stream("/model", tenant=tenant)
        durable: list[int] = []  # offsets of durable events, the model
        head = 0
        for op in ops:
            if op[0] == "append":
                flags = op[1]  # True = ephemeral
                results = await s.append_many([{"type": "m", "ephemeral": f} for f in flags])
                assert [r.offset for r in results] == list(range(head + 1, head + 1 + len(flags)))
                durable += [r.offset for r, f in zip(results, flags) if not f]
                head += len(flags)
            else:
                _, after, limit = op
                if after > head:
                    with pytest.raises(errors.InvalidCursor):
                        await s.read(after=after, limit=limit)
                    continue
                got = [e.offset for e in await s.read(after=after, limit=limit)]
                assert got == [o for o in durable if o > after][:limit]
                everything = [e.offset for e in await s.read(after=after, limit=limit, include_ephemeral=True)]
                assert everything == list(range(after + 1, head + 1))[:limit]
        assert (await s.info()).head == head if head else True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_read_matches_model(db_url, ops):
    import uuid

    asyncio.run(_run_model(db_url, "m" + uuid.uuid4().hex[:10], ops))


# --- byte caps: a page holds at most max_bytes of events ------------------------


def _sized(i: int, pad: int) -> dict:
    return {"type": "e", "payload": f"{i}:" + "x" * pad}


async def test_a_byte_cap_ends_a_page_and_says_so(y, tenant):
    from yoke.events import prepare

    s = y.stream("/bytes", tenant=tenant)
    events = [_sized(i, 1000) for i in range(10)]
    await s.append_many(events)
    size = prepare(events[0]).size
    assert all(prepare(e).size == size for e in events)
    page = await s.read_page(after=0, limit=100, max_bytes=3 * size)
    assert ([e.offset for e in page.events], page.sizes, page.capped) == ([1, 2, 3], [size] * 3, True)
    page = await s.read_page(after=0, limit=100, max_bytes=3 * size - 1)
    assert ([e.offset for e in page.events], page.capped) == ([1, 2], True)
    page = await s.read_page(after=4, limit=100, max_bytes=1)  # the first event, whatever its size
    assert ([e.offset for e in page.events], page.capped) == ([5], True)
    page = await s.read_page(after=9, limit=100, max_bytes=1)
    assert ([e.offset for e in page.events], page.capped) == ([10], False)  # nothing after it
    page = await s.read_page(after=5, limit=100, max_bytes=5 * size)  # exactly the rest
    assert ([e.offset for e in page.events], page.capped) == ([6, 7, 8, 9, 10], False)
    page = await s.read_page(after=0, limit=2, max_bytes=3 * size)  # the count ends it first
    assert ([e.offset for e in page.events], page.capped) == ([1, 2], False)
    page = await s.read_page(after=0, limit=100)  # no byte cap
    assert (len(page.events), page.sizes, page.capped) == (10, [size] * 10, False)
    assert [e.offset for e in await s.read(after=0, max_bytes=2 * size)] == [1, 2]
    assert [e.payload for e in await s.read(after=7, max_bytes=2 * size)] == [e["payload"] for e in events[7:9]]
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(errors.InvalidInput):
            await s.read(max_bytes=bad)


async def test_byte_capped_pages_with_ephemeral_events_skip_nothing(y, tenant):
    # Durable and ephemeral events of many sizes, interleaved; pages under
    # every byte cap, read on from each page's last offset, deliver exactly
    # the uncapped read, in order. A durable page cut by the cap must not
    # merge ephemeral events beyond its last event (the durable events
    # between would be skipped).
    import random

    rng = random.Random(7)
    s = y.stream("/bytes-mixed", tenant=tenant)
    for i in range(60):
        await s.append({**_sized(i, rng.choice((10, 300, 2000, 5000))), "ephemeral": rng.random() < 0.4})
    everything = [e.offset for e in await s.read(after=0, limit=1000, include_ephemeral=True)]
    durable = [e.offset for e in await s.read(after=0, limit=1000)]
    assert len(durable) < len(everything) == 60
    for include_ephemeral, expected in ((True, everything), (False, durable)):
        for cap in (1, 500, 2500, 6000, 20_000):
            for limit in (3, 1000):
                got: list[int] = []
                cursor = 0
                while True:
                    page = await s.read_page(after=cursor, limit=limit, include_ephemeral=include_ephemeral,
                                             max_bytes=cap)
                    assert page.events or not page.capped
                    if not page.events:
                        break
                    assert len(page.events) <= limit and len(page.sizes) == len(page.events)
                    assert len(page.events) == 1 or sum(page.sizes) <= cap
                    got += [e.offset for e in page.events]
                    cursor = page.events[-1].offset
                    if len(page.events) < limit and not page.capped:
                        assert got == expected  # a short page that is not capped ends at the head
                assert got == expected, (include_ephemeral, cap, limit)


async def test_read_stored_is_read_undecoded(y, tenant):
    # The Durable Streams protocol serves the stored JSON text as it is:
    # the same page as read, each payload the text that decodes to it.
    import orjson

    from yoke.store.contract import StoredEvent

    s = y.stream("/stored", tenant=tenant)
    events = [_sized(i, 300) for i in range(6)] + [
        {"type": "doc", "payload": {"b": [1, 2.5, None, True], "a": "é\u2028", "n": -(2**63)}},
    ]
    await s.append_many(events)
    read = await y.store.read(tenant, "/stored", 1, 100, 3 * 1000)
    stored = await y.store.read_stored(tenant, "/stored", 1, 100, 3 * 1000)
    assert all(isinstance(e, StoredEvent) for e in stored.events)
    assert [e.offset for e in stored.events] == [e.offset for e in read.events]
    assert [e.type for e in stored.events] == [e.type for e in read.events]
    assert [orjson.loads(e.payload_json) for e in stored.events] == [e.payload for e in read.events]
    assert (stored.head, stored.sizes, stored.capped, stored.stream_id) == (
        read.head, read.sizes, read.capped, read.stream_id,
    )
    whole = await y.store.read_stored(tenant, "/stored", 0, 100)
    assert orjson.loads(whole.events[-1].payload_json) == events[-1]["payload"]
    assert whole.events[-1].data is None
    missing = await y.store.read_stored(tenant, "/never", 0, 100)
    assert (missing.exists, missing.events) == (False, [])


async def test_read_payloads_joins_the_page_read_stored_would_return(y, tenant):
    # A protocol read of a JSON stream: the page's payload texts as stored,
    # joined into one JSON array by the database, the same page as
    # read_stored's (limit, offsets after ephemeral ones, head, closed).
    from yoke.http.durable_streams.messages import MESSAGE_TYPE, message_event, render

    path = "/joined"
    texts = ['{"n":1}', '{"b":[1,2.5,null,true],"a":"\u00e9\u2028","n":-9223372036854775808}', '"é ☃ 𝄞"', "[]"]
    await y.appends.append_protocol(tenant, path, [message_event(t) for t in texts[:2]], None)
    await y.stream(path, tenant=tenant).append({"type": MESSAGE_TYPE, "payload": 5, "ephemeral": True})
    await y.appends.append_protocol(tenant, path, [message_event(t) for t in texts[2:]], None)
    for after, limit in ((0, 100), (0, 2), (1, 2), (2, 100), (3, 1), (5, 100)):
        stored = await y.store.read_stored(tenant, path, after, limit, 1 << 20)
        joined = await y.store.read_payloads(tenant, path, after, limit, 1 << 20, MESSAGE_TYPE)
        assert joined is not None, (after, limit)
        assert joined.body == render(stored.events, "application/json"), (after, limit)
        assert joined.last == (stored.events[-1].offset if stored.events else None), (after, limit)
        assert (joined.head, joined.closed) == (stored.head, stored.closed) == (5, False)
    whole = await y.store.read_payloads(tenant, path, 0, 100, 1 << 20, MESSAGE_TYPE)
    assert whole.body == ("[" + ",".join(texts) + "]").encode()  # the texts as they were stored
    assert whole.last == 5  # offset 3 was the ephemeral event's
    assert (await y.store.read_payloads(tenant, path, 5, 100, 1 << 20, MESSAGE_TYPE)) == (5, False, None, b"[]")
    await y.stream(path, tenant=tenant).close()
    assert (await y.store.read_payloads(tenant, path, 0, 100, 1 << 20, MESSAGE_TYPE)).closed


async def test_read_payloads_leaves_other_pages_to_read_stored(y, tenant):
    from yoke.http.durable_streams.messages import MESSAGE_TYPE, message_event
    from yoke.store.durable_stream_forks import bytes_event

    path = "/mixed"
    messages = [message_event('{"pad":"%s"}' % ("x" * 50)) for _ in range(3)]
    await y.appends.append_protocol(tenant, path, messages, None)
    size = sum(e.size for e in messages)
    # Within the byte cap exactly, and one byte short of it.
    assert (await y.store.read_payloads(tenant, path, 0, 100, size, MESSAGE_TYPE)).last == 3
    assert await y.store.read_payloads(tenant, path, 0, 100, size - 1, MESSAGE_TYPE) is None
    await y.stream(path, tenant=tenant).append({"type": "other", "payload": 1})
    assert await y.store.read_payloads(tenant, path, 0, 100, 1 << 20, MESSAGE_TYPE) is None  # another type
    assert (await y.store.read_payloads(tenant, path, 0, 3, 1 << 20, MESSAGE_TYPE)).last == 3  # not in the page
    await y.appends.append_protocol(tenant, path, [bytes_event(b"raw")], None)
    assert await y.store.read_payloads(tenant, path, 4, 100, 1 << 20, "ds.bytes") is None  # bytes
    assert await y.store.read_payloads(tenant, "/never", 0, 100, 1 << 20, MESSAGE_TYPE) is None


async def test_pages_long_and_short_follow_the_cap_rule(y, tenant):
    # Byte caps, limits and byte messages, on pages long and short (SQLite
    # builds a long page in one statement and steps a short one): read and
    # read_stored cut every page by the rule (the first event always, then
    # while the total stays within the cap), and agree with each other.
    from yoke.events import prepare
    from yoke.store.durable_stream_forks import bytes_event

    s = y.stream("/stored-pages", tenant=tenant)
    events = [_sized(i, 90 * (i % 5)) for i in range(78)]
    await s.append_many(events)
    raw = [bytes_event(b"\x00\xffraw"), bytes_event(b"more")]
    await y.appends.append_protocol(tenant, "/stored-pages", raw, None)
    sizes = [prepare(e).size for e in events] + [e.size for e in raw]
    for after in (0, 3, 40, 47, 75, 79, 80):  # long pages from 0 and 3; short ones past 47
        for limit in (1, 5, 40, 100):
            for cap in (None, 1, sizes[0] + sizes[1], 700, 10_000, 100_000):
                window = list(range(after + 1, min(after + limit, len(sizes)) + 1))
                kept: list[int] = []
                for offset in window:
                    if kept and cap is not None and sum(sizes[o - 1] for o in kept) + sizes[offset - 1] > cap:
                        break
                    kept.append(offset)
                read = await y.store.read(tenant, "/stored-pages", after, limit, cap)
                stored = await y.store.read_stored(tenant, "/stored-pages", after, limit, cap)
                for page in (read, stored):
                    assert [e.offset for e in page.events] == kept, (after, limit, cap)
                    assert (page.sizes, page.capped, page.head) == (
                        [sizes[o - 1] for o in kept], len(kept) < len(window), 80,
                    ), (after, limit, cap)
                assert [e.data for e in stored.events] == [e.data for e in read.events]
                assert [orjson.loads(e.payload_json) for e in stored.events] == [e.payload for e in read.events]
    whole = await y.store.read(tenant, "/stored-pages", 0, 100)
    assert [e.payload for e in whole.events[:78]] == [e["payload"] for e in events]
    assert [e.data for e in whole.events[78:]] == [b"\x00\xffraw", b"more"]
