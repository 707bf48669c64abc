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
        # One batch: the actor's work.done must not land between the two.
        sent = await s.append_many([
            {"type": "work.assigned", "payload": {"role": "coder"}},
            {"type": "work.assigned", "payload": {"role": "tester"}},
        ])
        await y.wait_idle(timeout_s=10)
        assert seen == [("alice", sent[0].offset)]
        state, version = await y.instances("acme").state(inst.instance_id)
        assert state == {"done": 1} and version == 1
        page = await s.read(after=0)
        assert [e.type for e in page] == ["yoke.instance.created", "work.assigned", "work.assigned", "work.done"]


async def test_actors_receive_values_unchanged(fresh_url: str, tmp_path) -> None:
    """The queue keeps the event's JSON as written (PostgreSQL's jsonb
    turned the float 1e18 into an integer and -0.0 into 0.0), and so do
    instance config and schedules."""
    import math

    app = App()
    payload = {"f": 1e18, "h": 100.0, "z": -0.0, "i": 2**63 - 1, "s": "\U0001F600"}
    seen = []

    @app.actor("keeper", filter=Filter(types=["v"]))
    async def keeper(ctx, event):
        seen.append((event.payload, ctx.instance.config))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances("acme").create("keeper", key="k", config={"c": 1e18})
        await y.stream("/", "acme").append({"type": "v", "payload": payload})
        await y.wait_idle(timeout_s=10)
    ((got, config),) = seen
    assert got == payload and config == {"c": 1e18}
    assert [type(got[k]) for k in payload] == [float, float, float, int, str]
    assert type(config["c"]) is float and math.copysign(1, got["z"]) == -1
