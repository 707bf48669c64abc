"""Conversations, portals and child instances, on both backends."""

from __future__ import annotations

import asyncio

import yoke
from yoke import App, Filter, PortalRequest
from yoke.actors.portals import handle_request

T = "acme"


async def test_post_message_stores_it_and_appends_ids_only(fresh_url: str, tmp_path) -> None:
    app = App()
    read_back: list[dict] = []

    @app.actor("chat", filter=Filter(types=["user.said"]))
    async def chat(ctx, event):
        posted = await ctx.conversations.post_message(
            "c1", "user", {"text": event.payload["text"]}, metadata={"lang": "en"}
        )
        assert posted["offset"] is not None

    @app.actor("reader", filter=Filter(types=["conversation.message.posted"]))
    async def reader(ctx, event):
        msgs = await ctx.conversations.messages(event.payload["conversation_id"])
        read_back.append({"ids": event.payload, "count": len(msgs)})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("chat", key="k")
        await y.instances(T).create("reader", key="r")
        await y.stream("/", T).append_many([
            {"type": "user.said", "payload": {"text": "hi"}},
            {"type": "user.said", "payload": {"text": "there"}},
        ])
        await y.wait_idle(timeout_s=10)
        events = [e for e in await y.stream("/", T).read(after=0) if e.type == "conversation.message.posted"]
        assert len(events) == 2
        assert set(events[0].payload) == {"conversation_id", "message_id"}  # ids, never content
        assert events[0].correlation == "c1"
        msgs = await y.store.actors.messages(T, "c1", None, 100)
        assert [m.content for m in msgs] == [{"text": "hi"}, {"text": "there"}]
        assert [m.offset for m in msgs] == [e.offset for e in events]
        assert msgs[0].metadata == {"lang": "en"} and msgs[0].role == "user"
        assert [m.message_id for m in await y.store.actors.messages(T, "c1", msgs[0].seq, 100)] == [
            msgs[1].message_id
        ]
    assert len(read_back) == 2 and read_back[-1]["count"] == 2


async def test_a_message_is_not_stored_when_its_event_is_refused(fresh_url: str, tmp_path) -> None:
    app = App()
    codes: list[str] = []

    @app.actor("chat", filter=Filter(types=["say"]), max_attempts=1)
    async def chat(ctx, event):
        try:
            await ctx.conversations.post_message("c1", "user", "hello")
        except yoke.StreamClosed as exc:
            codes.append(exc.code)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("chat", key="k")
        await y.stream("/in", T).append({"type": "say"})
        await y.stream("/", T).create()
        await y.stream("/", T).close()
        await y.wait_idle(timeout_s=10)
        assert codes == ["stream_closed"]
        assert await y.store.actors.messages(T, "c1", None, 10) == []


async def test_children_know_their_parent(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("parent", filter=Filter(types=["spawn"]))
    async def parent(ctx, event):
        child = await ctx.instances.create("child", key="c", config={"from": ctx.instance.key})
        await ctx.state.set({"child": child["id"]})

    @app.actor("child")
    async def child(ctx, event):
        pass

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        p = await y.instances(T).create("parent", key="p")
        await y.stream("/", T).append({"type": "spawn"})
        await y.wait_idle(timeout_s=10)
        (state, _) = await y.instances(T).state(p.instance_id)
        c = await y.instances(T).get(state["child"])
        assert (c.actor, c.key, c.config, c.parent_id) == ("child", "c", {"from": "p"}, p.instance_id)
        assert c.filter is None  # an actor without a filter only gets what is sent to it


async def test_portal_request_appends_events(fresh_url: str, tmp_path) -> None:
    app = App()
    got: list[dict] = []

    @app.portal("github", tenant=T)
    async def github(ctx, request: PortalRequest):
        body = request.json()
        await ctx.append({"type": "github.push", "payload": {"repo": body["repo"]}}, stream="/github")
        return 202, {"queued": True, "path": request.path}

    @app.actor("ci", filter=Filter(types=["github.push"]))
    async def ci(ctx, event):
        got.append(event.payload)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("ci", key="k")
        status, body = await handle_request(
            y.actor_kernel, app, "github", PortalRequest("POST", "/hook", body=b'{"repo": "yoke"}'),
            worker_id=y.worker_id,
        )
        assert (status, body) == (202, {"queued": True, "path": "/hook"})
        await y.wait_idle(timeout_s=10)
    assert got == [{"repo": "yoke"}]


async def test_a_crashing_portal_loop_is_restarted_and_cancelled_on_close(fresh_url: str, tmp_path) -> None:
    app = App()
    runs: list[int] = []
    cancelled = asyncio.Event()
    steady = asyncio.Event()

    @app.portal("poller", tenant=T)
    async def poller(ctx, request):
        return None

    @poller.start
    async def loop(ctx):
        runs.append(len(runs) + 1)
        if len(runs) < 3:
            raise RuntimeError("crash")
        await ctx.append({"type": "poller.up", "payload": {"run": len(runs)}})
        steady.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await asyncio.wait_for(steady.wait(), 10)
        assert [e.payload for e in await y.stream("/", T).read(after=0)] == [{"run": 3}]
    assert runs == [1, 2, 3]
    assert cancelled.is_set()
