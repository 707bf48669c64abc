"""Which queued appends share a commit (streams/append.py, Appender's
groups): ephemeral events never share one with a guarded (protocol) append,
whose commit takes the store's guarded path, which does not relay ephemeral
events to other processes; other appends group as before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from yoke.events import prepare
from yoke.store.durable_streams import Guard
from yoke.streams.append import Appender, _Request


def _groups(*requests: tuple[bool, bool]) -> list[list[int]]:
    """The groups the appender takes from requests queued in this order, each
    (ephemeral, guarded), as lists of their positions."""
    loop = asyncio.new_event_loop()
    try:
        appender = Appender(SimpleNamespace(max_group_events=10_000), "t", "/s")  # type: ignore[arg-type]
        queued = []
        for ephemeral, guarded in requests:
            event = prepare({"type": "e", "payload": len(queued), "ephemeral": ephemeral})
            request = _Request([event], loop.create_future(), Guard(stream_id="x") if guarded else None)
            appender._queue.append(request)
            queued.append(request)
        groups = []
        while appender._queue:
            group = appender._take_group(allow_ephemeral=True)
            groups.append([queued.index(r) for r in group])
            appender._ephemeral_inflight = False
        return groups
    finally:
        loop.close()


def test_ephemeral_events_and_guarded_appends_commit_apart() -> None:
    # (ephemeral, guarded)
    assert _groups((False, True), (True, False), (False, True)) == [[0], [1], [2]]
    assert _groups((True, False), (False, True)) == [[0], [1]]
    assert _groups((True, False), (False, False), (False, True), (False, False)) == [[0, 1], [2, 3]]


def test_other_appends_still_group() -> None:
    assert _groups((False, True), (False, False), (False, True)) == [[0, 1, 2]]
    assert _groups((True, False), (False, False), (True, False)) == [[0, 1, 2]]
