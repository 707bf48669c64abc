"""A whole application in JavaScript (compiled TypeScript), no Python: its
default export is defineApp({actors, subscriptions}); yoke/applications.py
reads what it declares with Node and builds the App with the same
validation a Python one gets, and `yoke serve --app app.mjs` runs it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import yoke
from tests.http.conftest import start_server, stop_server
from yoke import errors
from yoke.applications import load
from yoke.routing.filters import Filter

SDK = (Path(__file__).resolve().parents[2] / "yoke" / "hosts" / "node" / "yoke.js").as_uri()

APP = """
import {{ defineApp }} from "{sdk}";
import {{ writeFile }} from "node:fs/promises";

console.log("importing the shop");  // before the manifest: not in its way
setInterval(() => {{}}, 60_000);  // keeps Node alive: reading the manifest must not wait for it

export default defineApp({{
  name: "shop",
  version: "shop-1",
  actors: {{
    cart: {{
      filter: {{ types: ["item.added"], streams: ["/carts/*"], where: "payload.qty > 0", key: "payload.cart" }},
      max_attempts: 3,
      effects: "atomic",
      process: async (ctx, event) => {{
        const cart = await ctx.state.update((s) => ({{ ...s, [event.payload.sku]: (s[event.payload.sku] ?? 0) + event.payload.qty }}), {{}});
        await ctx.append({{ type: "cart.changed", payload: {{ cart: ctx.instance.key, items: cart }} }}, "/changes");
      }},
    }},
    audit: {{
      filter: {{ types: ["cart.changed"], streams: ["/changes"] }},
      singleton: true,
      process: async (ctx, event) => {{
        await ctx.state.update((s) => ({{ seen: (s.seen ?? 0) + 1 }}), {{}});
      }},
    }},
    pricer: {{
      filter: {{ types: ["price.asked"], key: "payload.sku" }},
      process: async (ctx, event) => {{
        await ctx.state.set(await ctx.portals.call("shop", "price", {{ sku: event.payload.sku }}));
      }},
    }},
  }},
  portals: {{
    shop: {{
      handle: async (ctx, request) => {{
        if (request.method !== "POST") return [405, {{ error: "POST only" }}];
        const item = request.json();  // not JSON: a YokeError, answered 400
        const sent = await ctx.append({{ type: "item.added", payload: item }}, `/carts/${{item.cart}}`);
        return [202, {{ offset: sent.offset, path: request.path }}];
      }},
      start: async (ctx) => {{  // a loop: says it opened, then waits (it holds a host)
        await ctx.append({{ type: "shop.opened", payload: {{ at: ctx.now().toISOString() }} }}, "/shop");
        await new Promise(() => {{}});
      }},
      methods: {{
        price: async (ctx, params) => ({{ sku: params.sku, cents: params.sku === "tea" ? 350 : 100, portal: ctx.portal }}),
      }},
    }},
  }},
  receivers: {{
    // A call subscription's function: returning acknowledges the batch.
    ledger: async (batch) => {{
      const lines = batch.events.map((e) => `${{e.offset}} ${{e.payload.cart}}`);
      await writeFile(process.env.SHOP_LEDGER_FILE, lines.join("\\n") + "\\n", {{ flag: "a" }});
    }},
  }},
  subscriptions: [
    {{ source: "/changes", name: "archive", receiver: {{ kind: "copy", target: "/archive" }}, start: "beginning" }},
    {{ source: "/changes", name: "ledger", receiver: {{ kind: "call", function: "ledger" }}, start: "beginning",
      filter: {{ types: ["cart.changed"] }} }},
  ],
}});
"""


def write(tmp_path: Path, text: str, name: str = "app.mjs") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_javascript_application_is_read_with_the_checks_a_python_one_gets(tmp_path: Path) -> None:
    app = load(str(write(tmp_path, APP.format(sdk=SDK))))
    assert (app.name, app.version, sorted(app.actors)) == ("shop", "shop-1", ["audit", "cart", "pricer"])
    shop = app.portals["shop"]
    assert (shop.language, shop.script, sorted(shop.methods)) == ("node", str(tmp_path / "app.mjs"), ["price"])
    cart = app.actors["cart"]
    assert cart.language == "node" and cart.script == str(tmp_path / "app.mjs")
    assert isinstance(cart.filter, Filter) and cart.filter.key == "payload.cart" and cart.filter.where == "payload.qty > 0"
    assert (cart.max_attempts, cart.effects, app.actors["audit"].singleton) == (3, "atomic", True)
    assert [s.name for s in app.subscriptions.values()] == ["archive", "ledger"]
    assert sorted(app.receivers) == ["ledger"]

    def refused(text: str) -> str:
        with pytest.raises(errors.YokeError) as caught:
            load(str(write(tmp_path, text, "bad.mjs")))
        return caught.value.message

    assert "where" in refused(APP.format(sdk=SDK).replace("payload.qty > 0", "payload.qty >"))
    assert "unknown option(s) retries" in refused(APP.format(sdk=SDK).replace("max_attempts: 3", "retries: 3"))
    assert "no process" in refused(APP.format(sdk=SDK).replace("process: async (ctx, event) => {\n        await ctx.state.update((s) => ({ seen",
                                                                 "notprocess: async (ctx, event) => {\n        await ctx.state.update((s) => ({ seen"))
    assert "Error: broken" in refused('throw new Error("broken");\nexport default {};\n')
    assert "not defineApp" in refused("export default 42;\n")
    assert "no handle" in refused(APP.format(sdk=SDK).replace("handle: async (ctx, request)", "hndle: async (ctx, request)"))
    assert "names one of defineApp's receivers, not 'nowhere'" in refused(
        APP.format(sdk=SDK).replace('function: "ledger"', 'function: "nowhere"')
    )
    assert "processors are Python's" in refused(
        APP.format(sdk=SDK).replace('{ kind: "copy", target: "/archive" }', '{ kind: "processor", name: "p" }')
    )


async def test_a_javascript_application_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("SHOP_LEDGER_FILE", str(ledger))  # hosts get the environment but YOKE_*
    app = load(str(write(tmp_path, APP.format(sdk=SDK))))
    # Two hosts: the portal's loop holds one.
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=app, data_dir=str(tmp_path), host_processes=2) as y:
        assert y.executor.pools["node"].size == 3  # one more for the portal's loop
        carts = y.stream("/carts/c1")
        await carts.append({"type": "item.added", "payload": {"cart": "c1", "sku": "tea", "qty": 2}})
        await carts.append({"type": "item.added", "payload": {"cart": "c1", "sku": "tea", "qty": 0}})  # where: no
        await carts.append({"type": "item.added", "payload": {"cart": "c1", "sku": "jam", "qty": 1}})
        await y.wait_idle(timeout_s=30)
        instances = y.instances()
        cart = await instances.find("cart", "c1")
        assert cart is not None and (await instances.state(cart.instance_id))[0] == {"tea": 2, "jam": 1}
        [audit] = await instances.list("audit")
        assert (await instances.state(audit.instance_id))[0] == {"seen": 2}
        last = (await y.stream("/changes").info()).head
        await y.stream("/changes").wait_until_processed("archive", last, timeout_s=30)
        copied = [e.payload for e in await y.stream("/archive").read() if e.type == "cart.changed"]
        assert copied[-1] == {"cart": "c1", "items": {"tea": 2, "jam": 1}}
        # The call subscription's TypeScript receiver got each change once.
        await y.stream("/changes").wait_until_processed("ledger", last, timeout_s=30)
        offsets = [line.split()[0] for line in ledger.read_text().splitlines()]
        assert len(offsets) == 2 and len(set(offsets)) == 2
        # An actor calls a method of the TypeScript portal.
        await y.stream("/").append({"type": "price.asked", "payload": {"sku": "tea"}})
        await y.wait_idle(timeout_s=30)
        pricer = await instances.find("pricer", "tea")
        assert pricer is not None
        assert (await instances.state(pricer.instance_id))[0] == {"sku": "tea", "cents": 350, "portal": "shop"}
        # The portal's start loop ran (and runs on, holding its host).
        opened = [e for e in await y.stream("/shop").read() if e.type == "shop.opened"]
        assert len(opened) == 1


def test_yoke_serve_runs_a_javascript_application(tmp_path: Path) -> None:
    script = write(tmp_path, APP.format(sdk=SDK))
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(f"sqlite:///{tmp_path}/served.db", data, args=("--app", str(script)),
                          YOKE_HOST_PROCESSES="2")
    try:
        http = server.client()
        sent = http.post("/v1/streams/carts/c9/-/events",
                         json={"type": "item.added", "payload": {"cart": "c9", "sku": "tea", "qty": 5}})
        assert sent.status_code in (200, 201), sent.text
        # The TypeScript portal: a POST appends; a body that is not JSON is a 400.
        posted = http.post("/v1/portals/shop/items", json={"cart": "c9", "sku": "jam", "qty": 1})
        assert posted.status_code == 202 and posted.json()["path"] == "/items", posted.text
        bad = http.post("/v1/portals/shop", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input", bad.text
        assert http.get("/v1/portals/shop").status_code == 405
        deadline = time.monotonic() + 30
        while True:
            found = http.get("/v1/instances", params={"actor": "cart", "key": "c9"}).json()["instances"]
            state = http.get(f"/v1/instances/{found[0]['instance_id']}").json()["state"]["value"] if found else None
            if state == {"tea": 5, "jam": 1}:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
    finally:
        stop_server(server)  # graceful: uvicorn ends by raising SIGTERM again


async def test_reload_of_a_javascript_application_applies_its_code_and_refuses_its_definitions(tmp_path: Path) -> None:
    from tests.actors.test_isolation import WAIT_S, eventually
    from tests.actors.test_reload import rewrite

    script = write(tmp_path, APP.format(sdk=SDK))
    app = load(str(script))
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=app, data_dir=str(tmp_path), host_processes=2,
                         reload=True) as y:
        pool = y.executor.pools["node"]
        # New code (the audit counts by 10) and a new filter (qty 0 counts too).
        rewrite(script, APP.format(sdk=SDK).replace("(s.seen ?? 0) + 1", "(s.seen ?? 0) + 10")
                .replace("payload.qty > 0", "payload.qty >= 0"))

        async def recycled() -> bool:
            return pool.generation == 1

        await eventually(recycled)
        assert y.code is not None and y.code.refused == "the application's definitions changed (actor 'cart': filter)"
        carts = y.stream("/carts/c1")
        await carts.append({"type": "item.added", "payload": {"cart": "c1", "sku": "tea", "qty": 0}})  # refused filter
        await carts.append({"type": "item.added", "payload": {"cart": "c1", "sku": "tea", "qty": 1}})
        await y.wait_idle(timeout_s=WAIT_S)
        [audit] = await y.instances().list("audit")
        assert (await y.instances().state(audit.instance_id))[0] == {"seen": 10}  # the new code, once
