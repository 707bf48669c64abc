"""The application of tests/actors/test_inputs.py (host processes import it).

Every actor counts its key's events in state, appends one event and reads
the clock; an event whose payload says ``bad`` fails."""

from __future__ import annotations

from yoke import App, Filter

app = App()


async def count(ctx, event) -> None:
    if event.payload.get("bad"):
        raise ValueError(f"bad input {event.payload.get('n')}")
    await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1}, default={})
    await ctx.append({"type": "counted", "payload": {"n": event.payload.get("n")}}, stream="/counted")
    ctx.now()


for name, options in {
    "counter": {},
    "hosted": {"isolation": "process"},
    "atomic": {"effects": "atomic"},
    "bounded": {"keep_inputs": 2},
    "aged": {"keep_inputs_s": 60},
    "unkept": {"keep_inputs": 0},
}.items():
    app.actor(name, filter=Filter(types=[f"{name}.*"], key="payload.k"), max_attempts=2, retry_base_s=0.01,
              retry_max_s=0.02, **options)(count)


@app.actor("timer", filter=Filter(types=["timer.arm"], key="payload.k"))
async def timer(ctx, event) -> None:
    if event.type == "timer.arm":
        await ctx.schedules.upsert("soon", event={"type": "timer.fired", "payload": {"k": event.payload["k"]}},
                                   after_s=0)
    else:
        await ctx.state.set({"fired": True})
