"""Streams on both drivers: commit outcomes, reads and their byte caps,
stream info and listing, settings, retention, deletion, gap evidence."""

from __future__ import annotations

import pytest

from yoke import errors
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.results import Limits, Retention, StoredEvent, StreamSettings, StreamTotals

from .conftest import append, commit, ev, new_id


async def test_commit_assigns_offsets_from_one_and_raises_the_head(store, tenant):
    first = await append(store, tenant, "/a", 3)
    assert [(o.status, o.offset) for o in first.outcomes] == [("ok", 1), ("ok", 2), ("ok", 3)]
    assert first.head == 3
    second = await append(store, tenant, "/a", 2)
    assert [o.offset for o in second.outcomes] == [4, 5]
    assert second.head == 5
    assert len({o.id for o in (*first.outcomes, *second.outcomes)}) == 5
    page = await store.read(tenant, "/a", 0, 100)
    assert page.exists and page.head == 5 and page.pruned_through == 0
    assert [e.offset for e in page.events] == [1, 2, 3, 4, 5]
    assert [e.payload for e in page.events] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 0}, {"n": 1}]
    assert [e.id for e in page.events] == [o.id for o in (*first.outcomes, *second.outcomes)]


async def test_event_fields_round_trip(store, tenant):
    event = ev(
        "order.placed", payload=[1, "two", {"three": 3.5}, None], metadata={"trace": "abc"},
        source={"app": "shop"}, correlation="c-1", priority=7, group_id="g-1", idempotency_key="k-1",
    )
    result = await commit(store, tenant, "/f", [event])
    (read,) = (await store.read(tenant, "/f", 0, 10)).events
    assert (read.offset, read.id, read.at) == (1, result.outcomes[0].id, result.outcomes[0].at)
    assert (read.type, read.payload, read.metadata, read.source) == (
        "order.placed", [1, "two", {"three": 3.5}, None], {"trace": "abc"}, {"app": "shop"}
    )
    assert (read.correlation, read.priority, read.group_id, read.idempotency_key) == ("c-1", 7, "g-1", "k-1")
    assert (read.tenant, read.path) == (tenant, "/f")


async def test_same_key_same_event_is_a_duplicate_with_the_original_offset(store, tenant):
    first = await commit(store, tenant, "/k", [ev(payload=1, idempotency_key="k")])
    await append(store, tenant, "/k", 1)
    again = await commit(store, tenant, "/k", [ev(payload=1, idempotency_key="k")])
    (o,) = again.outcomes
    assert (o.status, o.offset, o.id) == ("duplicate", 1, first.outcomes[0].id)
    assert again.head == 2
    assert [e.offset for e in (await store.read(tenant, "/k", 0, 10)).events] == [1, 2]


async def test_same_key_other_event_conflicts_and_rejects_its_batch_whole(store, tenant):
    await commit(store, tenant, "/k", [ev(payload=1, idempotency_key="k")])
    result = await commit(
        store, tenant, "/k",
        [ev(payload="fine"), ev(payload=2, idempotency_key="k"), ev(payload="other batch")],
        [0, 0, 1],
    )
    statuses = [o.status for o in result.outcomes]
    assert statuses[1] == "conflict"
    assert statuses[0] != "ok"  # the conflicting event's batch writes nothing
    assert result.outcomes[2].status == "ok"
    page = await store.read(tenant, "/k", 0, 10)
    assert [e.payload for e in page.events] == [1, "other batch"]


async def test_a_closed_stream_takes_no_event_but_kernel_facts(store, tenant):
    await append(store, tenant, "/c", 1)
    info = await store.update_stream(tenant, "/c", closed=True)
    assert info is not None and info.closed
    result = await append(store, tenant, "/c", 2)
    assert [o.status for o in result.outcomes] == ["closed", "closed"]
    assert result.head == 1
    page = await store.read(tenant, "/c", 0, 10)
    assert page.closed and [e.offset for e in page.events] == [1]
    # the closing is recorded on "/" by the store itself
    facts = (await store.read(tenant, "/", 0, 100)).events
    assert "yoke.stream.closed" in [e.type for e in facts]
    await store.update_stream(tenant, "/", closed=True)
    outcome = await store.append_fact(
        tenant, prepare({"type": "yoke.test.fact"}, trusted=True), now_ms(), new_id()
    )
    assert outcome.status == "ok"


async def test_missing_streams(store, tenant):
    page = await store.read(tenant, "/nothing", 0, 10)
    assert not page.exists and page.events == [] and page.head == 0
    assert await store.info(tenant, "/nothing") is None
    assert await store.update_stream(tenant, "/nothing", closed=True) is None
    assert await store.delete_stream(tenant, "/nothing") is None


async def test_read_after_a_cursor_with_a_limit(store, tenant):
    await append(store, tenant, "/r", 10)
    page = await store.read(tenant, "/r", 3, 4)
    assert [e.offset for e in page.events] == [4, 5, 6, 7]
    assert page.head == 10 and not page.capped
    assert (await store.read(tenant, "/r", 10, 5)).events == []
    one = await store.read_one(tenant, "/r", 7)
    assert [e.offset for e in one.events] == [7]
    assert (await store.read_one(tenant, "/r", 11)).events == []


async def test_byte_cap_ends_a_page_but_always_returns_the_first_event(store, tenant):
    events = [ev(payload="x" * 100) for _ in range(5)]
    await commit(store, tenant, "/b", events)
    size = events[0].size
    page = await store.read(tenant, "/b", 0, 100, max_bytes=2 * size + 1)
    assert [e.offset for e in page.events] == [1, 2]
    assert page.sizes == [size, size] and page.capped
    tiny = await store.read(tenant, "/b", 0, 100, max_bytes=1)
    assert [e.offset for e in tiny.events] == [1] and tiny.capped
    whole = await store.read(tenant, "/b", 0, 100, max_bytes=100 * size)
    assert len(whole.events) == 5 and not whole.capped


async def test_read_stored_returns_the_stored_text(store, tenant):
    await commit(store, tenant, "/s", [ev("t", payload={"a": 1})])
    page = await store.read_stored(tenant, "/s", 0, 10)
    (stored,) = page.events
    assert isinstance(stored, StoredEvent)
    assert (stored.offset, stored.type, stored.data) == (1, "t", None)
    assert stored.payload_json.replace(" ", "") == '{"a":1}'


async def test_info_list_and_totals(store, tenant):
    info, created = await store.create_stream(
        tenant, "/x/one", new_id(), now_ms(),
        StreamSettings(retention=Retention(max_events=5), metadata={"k": "v"}),
    )
    assert created and info.head == 0 and info.retention == Retention(max_events=5)
    again, created = await store.create_stream(tenant, "/x/one", new_id(), now_ms(), StreamSettings())
    assert not created and again.stream_id == info.stream_id
    await append(store, tenant, "/x/two", 3)
    await append(store, tenant, "/y", 1)
    got = await store.info(tenant, "/x/two")
    assert got is not None
    assert (got.tenant, got.path, got.head, got.earliest, got.closed) == (tenant, "/x/two", 3, 1, False)
    assert got.usage.durable_events == 3
    assert (await store.info(tenant, "/x/one")).metadata == {"k": "v"}
    assert [s.path for s in await store.list_streams(tenant, "/x/", 10, None)] == ["/x/one", "/x/two"]
    assert [s.path for s in await store.list_streams(tenant, "/x/", 1, None)] == ["/x/one"]
    assert [s.path for s in await store.list_streams(tenant, "/x/", 10, "/x/one")] == ["/x/two"]
    # "/" counts too: the store records each stream's creation there
    every = await store.list_streams(tenant, "/", 100, None)
    assert "/" in [s.path for s in every]
    assert await store.stream_totals(tenant) == StreamTotals(len(every), sum(s.head for s in every))


async def test_pinned_stream_keeps_its_settings(store, tenant):
    await store.create_stream(tenant, "/p", new_id(), now_ms(), StreamSettings(pinned=True))
    with pytest.raises(errors.StreamPinned):
        await store.update_stream(tenant, "/p", retention=Retention(max_events=1))


async def test_retention_by_count_and_age(store, tenant):
    await append(store, tenant, "/keep3", 5)
    await store.update_stream(tenant, "/keep3", retention=Retention(max_events=3))
    old = now_ms() - 60_000
    await commit(store, tenant, "/aged", [ev(), ev()], now=old)
    await store.update_stream(tenant, "/aged", retention=Retention(max_age_s=30))
    removed = await store.prune(now_ms())
    assert removed >= 4
    info = await store.info(tenant, "/keep3")
    assert (info.head, info.earliest) == (5, 3)
    page = await store.read(tenant, "/keep3", 0, 10)
    assert page.pruned_through == 2 and [e.offset for e in page.events] == [3, 4, 5]
    aged = await store.info(tenant, "/aged")
    assert (aged.head, aged.earliest) == (2, 3)
    # offsets are never reused
    assert [o.offset for o in (await append(store, tenant, "/aged", 1)).outcomes] == [3]


async def test_legal_hold_keeps_events_and_the_stream(store, tenant):
    await append(store, tenant, "/held", 5)
    await store.update_stream(tenant, "/held", legal_hold=True, retention=Retention(max_events=1))
    await store.prune(now_ms())
    assert (await store.info(tenant, "/held")).earliest == 1
    with pytest.raises(errors.LegalHold):
        await store.delete_stream(tenant, "/held")


async def test_delete_then_create_again_is_a_new_lifetime(store, tenant):
    await append(store, tenant, "/d", 3)
    before = await store.info(tenant, "/d")
    deleted = await store.delete_stream(tenant, "/d")
    assert deleted is not None and deleted.stream_id == before.stream_id and deleted.head == 3
    assert await store.info(tenant, "/d") is None
    assert [o.offset for o in (await append(store, tenant, "/d", 1)).outcomes] == [1]
    assert (await store.info(tenant, "/d")).stream_id != before.stream_id


async def test_limits_refuse_past_the_total_ceiling(store, tenant):
    await append(store, tenant, "/q", 1)
    await store.update_stream(tenant, "/q", limits=Limits(max_total_events=2))
    result = await append(store, tenant, "/q", 2)
    assert [o.status for o in result.outcomes] == ["quota", "quota"]
    assert [o.status for o in (await append(store, tenant, "/q", 1)).outcomes] == ["ok"]


async def test_gap_evidence_newest_first(store, tenant):
    await append(store, tenant, "/g", 5)
    await store.record_gap(tenant, "/g", 2, 3, "sweep", 100, "p1")
    await store.record_gap(tenant, "/g", 4, 4, "resync", 200, "p1")
    gaps = await store.gaps(tenant, "/g", 10)
    assert [(g.first, g.last, g.cause) for g in gaps] == [(4, 4, "resync"), (2, 3, "sweep")]


async def test_tenants_do_not_meet(store, tenant):
    await append(store, tenant, "/shared", 2)
    other = new_id("t")
    assert await store.info(other, "/shared") is None
    assert [o.offset for o in (await append(store, other, "/shared", 1)).outcomes] == [1]
