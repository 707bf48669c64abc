from __future__ import annotations

import yoke
from yoke import App, Filter


async def test_event_reaches_instance_and_state(fresh_url: str, tmp_path) -> None:
    app = App()
    seen = []

    @app.actor("coder", filter=Filter(types=["work.assigned"], where='payload.role = "coder"'))
    async def coder(ctx, event):
        seen.append((ctx.instance.key, event.offset))
        await ctx.state.update(lambda s: {**s, "done": s.get("done", 0) + 1})
        await ctx.append({"type": "work.done", "payload": {"by": ctx.instance.key}, "correlation": event.correlation})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances("acme").create("coder", key="alice")
        s = y.stream("/", "acme")
        await s.append({"type": "work.assigned", "payload": {"role": "coder"}})
        await s.append({"type": "work.assigned", "payload": {"role": "tester"}})
        await y.wait_idle(timeout_s=10)
        assert seen == [("alice", 1)]
        state, version = await y.instances("acme").state(inst.instance_id)
        assert state == {"done": 1} and version == 1
        page = await s.read(after=0)
        assert [e.type for e in page] == ["work.assigned", "work.assigned", "work.done"]
