"""One injected clock: a runtime opened with ``clock=`` stamps every time it
stores by it (the events' created_at, in the appender and in the store's own
facts, the subscriptions' progress and their copies, tokens and their
expiry), on both backends. The clock here is a virtual one standing in
2001 (monotonic time runs: the runtime's loops still wait and wake)."""

from __future__ import annotations

import pytest

import yoke
from yoke import errors
from yoke.clock import VirtualClock
from yoke.subscriptions.receivers import from_dict

T = "default"
START_S = 1_000_000_000.25  # 2001-09-09T01:46:40.250Z: no real clock says this


async def test_what_the_runtime_stores_follows_its_clock(fresh_url: str) -> None:
    clock = VirtualClock(START_S)
    at_ms = int(START_S * 1000)
    async with yoke.open(fresh_url, clock=clock) as y:
        source = y.stream("/clock/source")
        first = await source.append({"type": "x"})
        [event] = [e for e in await source.read() if e.offset == first.offset]
        assert event.at == at_ms  # the appender's commit
        assert (await source.info()).created_at == at_ms

        # The store's own facts: a deleted stream's fact on '/'.
        doomed = y.stream("/clock/doomed")
        await doomed.append({"type": "x"})
        await doomed.delete()
        facts = [e for e in await y.stream("/").read() if e.type == "yoke.stream.deleted"]
        assert facts and {e.at for e in facts} == {at_ms}

        # A subscription: configured at the clock's time; its copies too.
        await source.subscribe("copy", from_dict({"kind": "copy", "target": "/clock/target"}), start="beginning")
        row = await y.store.subscriptions.get(T, "/clock/source", "copy")
        assert row is not None and row.configured_ms == at_ms
        last = await source.append({"type": "y"})
        await source.wait_until_processed("copy", last.offset, timeout_s=30)
        copies = [e for e in await y.stream("/clock/target").read() if e.type in ("x", "y")]
        assert [e.type for e in copies] == ["x", "y"] and {e.at for e in copies} == {at_ms}

        # Tokens: created, and refused once the clock passes their expiry.
        token = await y.tokens.create(T, ["read"], "clocked", expires_in_s=60)
        assert (token.info.created_at, token.info.expires_at) == (at_ms, at_ms + 60_000)
        assert (await y.tokens.authenticate(token.token)).token_id == token.info.token_id
        clock.set(START_S + 61)
        with pytest.raises(errors.TokenExpired):
            await y.tokens.authenticate(token.token)
