"""The application the actor HTTP tests serve (``yoke serve --app
tests.http.actor_app:app``, ``yoke worker --app ...``).

- ``counter`` counts ``count.*`` events in its state (and remembers the last payload);
- ``flaky`` fails on ``flaky.fail`` events until a ``flaky.heal`` event
  reached the instance (2 attempts, fast retries), so a dead row succeeds
  once redriven after a heal;
- ``worker`` takes its filter from its config (``{"role": ...}``);
- ``planner`` keeps ``plan.*`` payloads in its own table ``plans`` (name,
  qty, note) and a cron schedule ``nightly``;
- the ``hooks`` portal appends the JSON body it receives as ``count.hook``
  to ``/hooks/<the path below the portal>``, if the sender signs it with the
  header ``X-Signature: ok`` (the portal verifies its sender itself);
  ``GET`` echoes what the handler was given.
"""

from __future__ import annotations

from yoke import App, Filter

app = App()


@app.actor("counter", filter=Filter(types=["count.*"]))
async def counter(ctx, event):
    await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1, "last": event.payload, "path": event.path})


@app.actor("flaky", filter=Filter(types=["flaky.*"]), max_attempts=2, retry_base_s=0.01, retry_max_s=0.05)
async def flaky(ctx, event):
    state = await ctx.state.get({})
    if event.type == "flaky.heal":
        await ctx.state.set({**state, "healed": True})
        return
    if event.type == "flaky.fail" and not state.get("healed"):
        raise RuntimeError(f"flaky refuses {event.payload}")
    await ctx.state.set({**state, "done": state.get("done", 0) + 1})


@app.actor(
    "worker", filter_from_config=lambda c: {"types": ["work.*"], "where": f'payload.role = "{c["role"]}"'}
)
async def worker(ctx, event):
    await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1})


@app.actor("planner", filter=Filter(types=["plan.*"]))
async def planner(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS plans (name TEXT PRIMARY KEY, qty INTEGER, note TEXT)")
    await ctx.sqlite.exec("INSERT OR REPLACE INTO plans VALUES (?, ?, ?)",
                          [event.payload["name"], event.payload["qty"], event.payload.get("note")])
    await ctx.schedules.upsert("nightly", cron="0 3 * * *", event={"type": "plan.review"})


@app.portal("hooks")
async def hooks(ctx, request):
    if request.method == "GET":
        return {"tenant": ctx.tenant, "path": request.path, "query": request.query}
    if request.headers.get("x-signature") != "ok":
        return 401, {"error": "bad signature"}
    stream = "/hooks" + (request.path if request.path != "/" else "")
    appended = await ctx.append({"type": "count.hook", "payload": request.json()}, stream=stream)
    if request.query.get("quiet"):
        return None
    return 202, {"tenant": ctx.tenant, "stream": stream, **appended}
