"""ctx.portals.call: an actor calls a method of the application's portal
through the op handler, with JSON in and out, a timeout and defined errors;
on both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter
from yoke.actors.context import PortalContext
from yoke.actors.ops import OpHandler
from yoke.events import MAX_DEPTH
from tests.actors.test_effects_atomic import nested

T = "acme"


def calling_app(cases: list[tuple[str, dict]], outcomes: dict[str, object], cancelled: asyncio.Event) -> App:
    app = App()

    @app.portal("github", tenant="elsewhere")
    async def github(ctx, request):
        return None

    @github.method("open_issue")
    async def open_issue(ctx: PortalContext, params):
        params["seen"] = True  # a copy: the caller's dict is not touched
        sent = await ctx.append({"type": "github.issue.opened", "payload": params}, stream="/github")
        return {"number": 7, "offset": sent["offset"], "tenant": ctx.tenant}

    @github.method("slow")
    async def slow(ctx, params):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @github.method("broken")
    async def broken(ctx, params):
        raise ValueError("no token configured")

    @github.method("closed")
    async def closed(ctx, params):
        await ctx.append({"type": "x"}, stream="/shut")

    @github.method("not_json")
    async def not_json(ctx, params):
        return {1, 2}

    @app.actor("caller", filter=Filter(types=["go"]), max_attempts=1)
    async def caller(ctx, event):
        for label, call in cases:
            mine = dict(call.get("params") or {})
            try:
                kwargs = {"timeout_s": call["timeout_s"]} if "timeout_s" in call else {}
                outcomes[label] = await ctx.portals.call(call["portal"], call["method"], mine, **kwargs)
                if mine.get("seen"):
                    outcomes[label + ":mutated"] = True
            except yoke.YokeError as exc:
                outcomes[label] = exc

    return app


async def test_an_actor_calls_a_portal_method_with_json_and_gets_its_answer_or_a_defined_error(
    fresh_url: str, tmp_path
) -> None:
    cases = [
        ("ok", {"portal": "github", "method": "open_issue", "params": {"title": "bug"}}),
        ("no_portal", {"portal": "gitlab", "method": "open_issue"}),
        ("no_method", {"portal": "github", "method": "close_issue"}),
        ("timeout", {"portal": "github", "method": "slow", "timeout_s": 0.2}),
        ("raised", {"portal": "github", "method": "broken"}),
        ("yoke_error", {"portal": "github", "method": "closed"}),
        ("not_json", {"portal": "github", "method": "not_json"}),
        ("bad_timeout", {"portal": "github", "method": "open_issue", "timeout_s": 0}),
        ("bad_params", {"portal": "github", "method": "open_issue", "params": {"x": float("nan")}}),
        ("too_deep", {"portal": "github", "method": "open_issue", "params": {"x": nested(MAX_DEPTH)}}),
    ]
    outcomes: dict[str, object] = {}
    cancelled = asyncio.Event()
    app = calling_app(cases, outcomes, cancelled)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/shut", T).create()
        await y.stream("/shut", T).close()
        await y.instances(T).create("caller", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=20)
        # The method ran in the caller's tenant (not the portal's default one).
        opened = await y.stream("/github", T).read()
        assert [e.payload for e in opened] == [{"title": "bug", "seen": True}]
        assert outcomes["ok"] == {"number": 7, "offset": opened[0].offset, "tenant": T}
        assert "ok:mutated" not in outcomes  # params crossed as JSON, a copy
        assert await y.stream("/github", "elsewhere").read() == []

    assert isinstance(outcomes["no_portal"], yoke.PortalNotFound)
    assert outcomes["no_portal"].http_status == 404
    assert isinstance(outcomes["no_method"], yoke.PortalMethodNotFound)
    assert outcomes["no_method"].to_dict()["method"] == "close_issue"
    timeout = outcomes["timeout"]
    assert isinstance(timeout, yoke.PortalTimeout) and timeout.http_status == 504
    assert timeout.to_dict()["timeout_s"] == 0.2
    assert cancelled.is_set()  # the method does not run on after its caller gave up
    raised = outcomes["raised"]
    assert isinstance(raised, yoke.PortalCallFailed) and raised.http_status == 502
    assert raised.to_dict()["error"] == "ValueError" and "no token configured" in raised.message
    assert isinstance(outcomes["yoke_error"], yoke.StreamClosed)  # a YokeError keeps its code
    assert isinstance(outcomes["not_json"], yoke.PortalCallFailed)
    assert outcomes["not_json"].to_dict()["error"] == "not_json"
    assert type(outcomes["bad_timeout"]) is yoke.InvalidInput
    assert outcomes["bad_timeout"].to_dict()["field"] == "timeout_s"
    assert type(outcomes["bad_params"]) is yoke.InvalidInput  # not JSON: refused at the seam
    too_deep = outcomes["too_deep"]  # params of 65 levels: beyond the domain, as over HTTP
    assert type(too_deep) is yoke.InvalidInput and too_deep.to_dict()["field"].startswith("params.x[0]")


async def test_an_unhandled_portal_error_fails_the_run_like_any_other(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.portal("p")
    async def p(ctx, request):
        return None

    @p.method("slow")
    async def slow(ctx, params):
        await asyncio.Event().wait()  # never answers: the call times out

    @app.actor("caller", filter=Filter(types=["go"]), max_attempts=1)
    async def caller(ctx, event):
        await ctx.portals.call("p", "slow", timeout_s=0.1)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        info = await y.instances(T).create("caller", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=20)
        dead = await y.instances(T).dead(info.instance_id)
        assert len(dead) == 1 and "PortalTimeout" in dead[0].last_error


async def test_portal_call_needs_an_actor_and_portal_methods_are_async(fresh_url: str) -> None:
    app = App()

    @app.portal("p")
    async def p(ctx, request):
        return None

    with pytest.raises(yoke.InvalidInput):
        p.method("sync")(lambda ctx, params: None)

    @p.method("m")
    async def m(ctx, params):
        return params

    with pytest.raises(yoke.InvalidInput):
        p.method("m")  # registered twice
    async with yoke.open(fresh_url, app=app, executor=False) as y:
        ops = OpHandler(y.actor_kernel, y.app, T, None)  # a portal's own context has no instance
        with pytest.raises(yoke.InvalidInput, match="needs an actor instance"):
            await ops.call("portal_call", {"portal": "p", "method": "m"})
