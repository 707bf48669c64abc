"""copy_to_stream: provenance, idempotent retries, deliberate replays,
cycles and the hop bound, the receiver's passive fence."""

from __future__ import annotations

import pytest

import yoke
from yoke.subscriptions import copies as copy
from yoke.subscriptions.runner import Batch

from .common import FAST, copying


async def _settle(stream, name: str) -> None:  # noqa: ANN001
    await stream.wait_until_processed(name, (await stream.info()).head, timeout_s=10)


async def test_three_stream_chain_keeps_provenance(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b, c = y.stream("/a", "acme"), y.stream("/b", "acme"), y.stream("/c", "acme")
        ab = await a.subscribe("a-to-b", yoke.copy_to_stream("/b"), filter={"types": ["order.*"]})
        bc = await b.subscribe("b-to-c", yoke.copy_to_stream("/c"), filter={"types": ["order.*"]})
        sent = await a.append({
            "type": "order.placed", "payload": {"id": 7}, "metadata": {"m": 1},
            "correlation": "corr-1", "source": {"app": "shop"},
        })
        await _settle(a, "a-to-b")
        await _settle(b, "b-to-c")
        [copied] = [e for e in await c.read() if e.type == "order.placed"]
        assert copied.payload == {"id": 7} and copied.metadata == {"m": 1}
        assert copied.correlation == "corr-1" and copied.source["app"] == "shop"
        info_a, info_b = await a.info(), await b.info()
        [hop_a, hop_b] = copied.source["copied_from"]
        assert hop_a == {
            "stream_id": info_a.stream_id, "created_at": info_a.created_at, "path": "/a",
            "name": "a-to-b", "offset": sent.offset, "type": "order.placed", "at": hop_a["at"],
            "generation": ab.offset,
        }
        [on_b] = [e for e in await b.read() if e.type == "order.placed"]
        assert hop_b["stream_id"] == info_b.stream_id and hop_b["path"] == "/b"
        assert hop_b["offset"] == on_b.offset and hop_b["generation"] == bc.offset
        assert copied.idempotency_key.startswith("yoke:copy:")
        [record] = await y.store.subscriptions.inbound("acme", "/c")
        assert (record.source_path, record.name, record.source_stream_id) == ("/b", "b-to-c", info_b.stream_id)
        assert record.generation == bc.offset and record.received == 1


async def test_cycle_terminates_with_one_audit_event(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe("to-b", yoke.copy_to_stream("/b"), filter={"types": ["ping", "yoke.error"]})
        await b.subscribe("to-a", yoke.copy_to_stream("/a"), filter={"types": ["ping", "yoke.error"]})
        await a.append({"type": "ping"})
        for _ in range(3):  # both directions settle: nothing keeps travelling
            await _settle(a, "to-b")
            await _settle(b, "to-a")
        on_a, on_b = await a.read(), await b.read()
        assert [e.type for e in on_a if not e.type.startswith("yoke.subscription")] == ["ping", "yoke.error"]
        assert [e.type for e in on_b if not e.type.startswith("yoke.subscription")] == ["ping"]
        audit = on_a[-1]
        assert audit.payload["kind"] == "copy_dropped" and audit.payload["reason"] == "cycle"
        assert audit.payload["source_path"] == "/b" and audit.payload["name"] == "to-a"
        assert (await b.subscription("to-a")).processed_through_offset == (await b.info()).head


async def test_hop_bound_drops_a_copy_with_32_hops(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe("to-b", yoke.copy_to_stream("/b"))
        chain = [{"path": f"/hop/{i}", "offset": 1} for i in range(32)]
        await a._append(
            [{"type": "far", "source": {"copied_from": chain}}, {"type": "near"}], trusted=True
        )
        await _settle(a, "to-b")
        received = await b.read()
        assert [e.type for e in received] == ["yoke.error", "near"]
        assert received[0].payload["reason"] == "hop_limit" and received[0].payload["hops"] == 32


def _batch(y, info, generation: int, events) -> Batch:  # noqa: ANN001
    return Batch("default", "/a", "s", info.stream_id, info.created_at, generation, 1, events)


async def test_retried_batch_is_a_no_op_and_a_replay_after_a_cursor_move_copies_again(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        sub = await a.subscribe("s", yoke.copy_to_stream("/b"), filter={"types": ["x"]})
        await a.append_many([{"type": "x", "payload": {"i": i}} for i in range(3)])
        await _settle(a, "s")
        assert len(await b.read()) == 3
        # The same batch sent again (an acknowledgement lost in the network).
        events = (await a.read())[1:]
        await copy.send(_batch(y, await a.info(), sub.offset, events), "/b", copying(y))
        assert len(await b.read()) == 3
        # A deliberate replay: the operator moves the cursor back.
        moved = await a.set_cursor("s", sub.offset)
        await a.wait_until_processed("s", 4, timeout_s=10)
        copies = await b.read()
        assert [e.payload["i"] for e in copies] == [0, 1, 2, 0, 1, 2]
        assert {e.source["copied_from"][0]["generation"] for e in copies[3:]} == {moved.generation}


async def test_passive_fence_rejects_an_older_generation(fresh_url: str) -> None:
    async with yoke.open(fresh_url, executor=False) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.append_many([{"type": "x"}, {"type": "y"}])
        info = await a.info()
        events = await a.read()
        await copy.send(_batch(y, info, 5, events[:1]), "/b", copying(y))
        with pytest.raises(copy.Fenced):
            await copy.send(_batch(y, info, 4, events[1:]), "/b", copying(y))  # a superseded run
        assert [e.type for e in await b.read()] == ["x"]
        await copy.send(_batch(y, info, 5, events), "/b", copying(y))  # equal stamps: redelivery, deduplicated
        assert [e.type for e in await b.read()] == ["x", "y"]
        older_lifetime = Batch("default", "/a", "s", "str_old", info.created_at - 1, 9, 1, events)
        with pytest.raises(copy.Fenced):
            await copy.send(older_lifetime, "/b", copying(y))
        [record] = await y.store.subscriptions.inbound("default", "/b")
        assert (record.generation, record.received) == (5, 2)


async def test_audit_lines_are_not_copied_onward(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe("to-b", yoke.copy_to_stream("/b"))  # every type
        await a._append([{"type": "yoke.error", "payload": {"kind": "local"}}, {"type": "x"}], trusted=True)
        await _settle(a, "to-b")
        assert [e.type for e in await b.read()] == ["x"]


async def test_transform_reshapes_copies_and_keeps_coordinates(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe(
            "s", yoke.copy_to_stream("/b"), transform='{"type": "shaped", "payload": {"n": payload.i * 2}}'
        )
        sent = await a.append({"type": "x", "payload": {"i": 21}, "metadata": {"keep": True}})
        await _settle(a, "s")
        [copied] = await b.read()
        assert (copied.type, copied.payload, copied.metadata) == ("shaped", {"n": 42}, {"keep": True})
        assert copied.source["copied_from"][0]["offset"] == sent.offset


async def test_an_event_at_the_size_limit_is_still_copied(fresh_url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        a, b = y.stream("/a"), y.stream("/b")
        await a.subscribe("s", yoke.copy_to_stream("/b"), filter={"types": ["big"]})
        limit = y.settings.max_event_bytes
        size = limit - 200
        while True:  # the largest payload the source accepts
            try:
                sent = await a.append({"type": "big", "payload": {"b": "x" * size}})
                break
            except yoke.EventTooLarge:
                size -= 50
        await a.wait_until_processed("s", sent.offset, timeout_s=10)
        [copied] = await b.read()
        assert len(copied.payload["b"]) == size and copied.source["copied_from"][0]["offset"] == sent.offset


async def test_a_receiving_stream_subscribes_to_events_from_a_source(fresh_url: str) -> None:
    """subscribe_to_events_from is declared on the receiver and stores the
    same configuration in the source's log as subscribe(copy_to_stream)."""
    async with yoke.open(fresh_url, **FAST) as y:
        github, reviewer = y.stream("/integrations/github", "acme"), y.stream("/agents/reviewer", "acme")
        await github.append({"type": "push", "payload": {"repo": "old"}})
        sub = await reviewer.subscribe_to_events_from(
            "/integrations/github", name="github-for-reviewer",
            filter={"types": ["push"], "where": 'payload.repo = "acme/widgets"'},
        )
        assert sub.created and sub.name == "github-for-reviewer"
        [configured] = [e for e in await github.read() if e.type == "yoke.subscription.configured"]
        assert configured.offset == sub.offset
        assert configured.payload["config"]["kind"] == "copy"
        assert configured.payload["config"]["target"] == "/agents/reviewer"
        assert configured.payload["config"]["start"] == "now"
        assert await reviewer.read() == []  # nothing stored on the receiver at configure time
        sent = await github.append_many([
            {"type": "push", "payload": {"repo": "acme/widgets"}},
            {"type": "push", "payload": {"repo": "acme/other"}},
        ])
        await _settle(github, "github-for-reviewer")
        [copied] = await reviewer.read()
        assert copied.payload == {"repo": "acme/widgets"}
        assert copied.source["copied_from"][0]["offset"] == sent[0].offset
        # Same name, same configuration, declared either way: nothing appended.
        again = await github.subscribe(
            "github-for-reviewer", yoke.copy_to_stream("/agents/reviewer"),
            filter={"types": ["push"], "where": 'payload.repo = "acme/widgets"'},
        )
        assert not again.created and again.offset == sub.offset
        # A generated name, and the handle form.
        generated = await reviewer.subscribe_to_events_from(github, start="beginning")
        assert generated.name == f"subscription:{generated.offset}"
        await _settle(github, generated.name)
        assert len([e for e in await reviewer.read() if e.type == "push"]) == 1 + 3
        with pytest.raises(yoke.InvalidSubscription):
            await reviewer.subscribe_to_events_from(y.stream("/integrations/github", "other"))
        with pytest.raises(yoke.InvalidSubscription):
            await reviewer.subscribe_to_events_from("/agents/reviewer")  # itself
        with pytest.raises(yoke.InvalidFilter):
            await reviewer.subscribe_to_events_from(github, filter={"where": "payload.("})
