"""Fan-out across a stream's deletion: the new stream on the same path is
routed from its first event, in this process and in another one (whose
cached fan-out cursor belonged to the old stream)."""

from __future__ import annotations

import yoke
from yoke import App, Filter


async def test_a_recreated_stream_is_routed_from_its_first_event(fresh_url: str, tmp_path) -> None:
    app = App()
    seen: list[tuple[str, int]] = []

    @app.actor("watcher", filter=Filter(types=["w"]))
    async def watcher(ctx, event):
        seen.append((event.payload, event.offset))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path / "a")) as a, \
            yoke.open(fresh_url, executor=False) as b:
        await a.instances("acme").create("watcher", key="k")
        s = b.stream("/work", "acme")  # appended and deleted by the other process
        await s.append_many([{"type": "w", "payload": "old"}] * 5)
        await a.wait_idle(timeout_s=20)
        assert seen == [("old", i) for i in range(1, 6)]
        await s.delete()
        await s.append_many([{"type": "w", "payload": "new"}] * 2)  # a head below the cached cursor
        a.executor.fanout.appended("acme", "/work")  # SQLite: no NOTIFY from another process
        await a.wait_idle(timeout_s=20)
        assert seen[5:] == [("new", 1), ("new", 2)]
        # And deleted by this process: its cache is dropped at once.
        await a.stream("/work", "acme").delete()
        await a.stream("/work", "acme").append({"type": "w", "payload": "third"})
        await a.wait_idle(timeout_s=20)
        assert seen[7:] == [("third", 1)]
