"""--reload: isolated actors pick up changed code on new hosts; no queue row
is lost or run twice; the new code is a new deploy version, so subscriptions
halted under the old one resume (docs/advanced/hosts.md#reloading)."""

from __future__ import annotations

import base64
import os
import shutil
import sys
import uuid

import pytest

import yoke
from tests.actors.test_isolation import WAIT_S, eventually
from tests.subscriptions.webhook_server import Request, WebhookReceiver
from yoke.actors.app import load_app
from yoke.hosts.reload import code_version

SOURCE = '''
import os
import shutil
from yoke import App, Filter

app = App()


@app.actor("versioned", filter=Filter(types=["go"]), isolation="process")
async def versioned(ctx, event):
    await ctx.state.update(lambda s: {{"runs": s.get("runs", 0) + 1, "version": {version}, "pid": os.getpid()}})
'''


@pytest.fixture
def package(tmp_path):
    """A package of the test's own on sys.path: (its name, its __init__.py)."""
    name = f"reloadapp_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code" / name
    folder.mkdir(parents=True)
    sys.path.insert(0, str(folder.parent))
    try:
        yield name, folder / "__init__.py"
    finally:
        sys.path.remove(str(folder.parent))


def rewrite(module, text: str) -> None:
    """New contents with a modification time the watch cannot miss (some
    file systems keep coarse times)."""
    module.write_text(text)
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


async def test_reload_runs_new_code_on_new_hosts(fresh_url: str, tmp_path, package) -> None:
    name, module = package
    module.write_text(SOURCE.format(version=1))
    app = load_app(f"{name}:app")
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, host_processes=2) as y:
        instances = y.instances("acme")
        inst = await instances.create("versioned", key="a")
        await y.stream("/", "acme").append({"type": "go"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["version"] == 1 and state["runs"] == 1
        old_pid = state["pid"]
        pool = y.executor.hosts

        rewrite(module, SOURCE.format(version=2))
        await eventually(lambda: _async(
            pool.generation == 1 and len(pool.hosts) == 2 and all(h.generation == 1 for h in pool.hosts)
        ))
        await y.stream("/", "acme").append({"type": "go"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["version"] == 2 and state["runs"] == 2  # each row ran once
        assert state["pid"] != old_pid
        assert (await instances.depth(inst.instance_id)).dead == 0


async def _async(value):
    return value


WEBHOOK_APP = '''
from yoke import App

app = App()  # {note}
'''
FAST = {"subscription_retry_base_s": 0.01, "subscription_retry_max_s": 0.05, "subscription_sweep_s": 0.1}


async def test_new_code_is_a_new_deploy_version_and_resumes_its_halts(
    fresh_url: str, tmp_path, package,
) -> None:
    """A webhook halts under the first code's version; the fix is deployed
    by changing the code, which --reload sees: the halt resumes, once, under
    the new version. A halt recorded without a version (a process without
    --reload or a version) is the operator's and stays."""
    name, module = package
    module.write_text(WEBHOOK_APP.format(note="first"))
    broken = True

    def respond(request: Request) -> int:
        return 500 if broken else 204

    async with WebhookReceiver(respond) as hook:
        webhook = yoke.webhook(hook.url, "whsec_" + base64.b64encode(os.urandom(32)).decode())

        async def halted(s, sub):
            status = await s.subscription(sub)
            return status if status.halted is not None else None

        # Unversioned: no --reload, no deploy version.
        async with yoke.open(fresh_url, data_dir=str(tmp_path), **FAST) as y:
            s = y.stream("/orders", "acme")
            await s.subscribe("operators", webhook)
            first = (await s.append({"type": "a"})).offset
            assert (await eventually(lambda: halted(s, "operators"))).halted["version"] == ""

        app = load_app(f"{name}:app")
        v1 = code_version([module])
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, **FAST) as y:
            assert y.deliveries.version == v1
            s = y.stream("/orders", "acme")
            await s.subscribe("deploys", webhook)
            second = (await s.append({"type": "b"})).offset
            status = await eventually(lambda: halted(s, "deploys"))
            assert status.halted["version"] == v1 and status.halted["offset"] == second

            broken = False  # the fix...
            rewrite(module, WEBHOOK_APP.format(note="fixed"))  # ...is deployed
            v2 = code_version([module])
            assert v2 != v1
            await s.wait_until_processed("deploys", second, timeout_s=WAIT_S)
            assert y.deliveries.version == v2
            resumed = [e.payload for e in await s.read(0) if e.type == "yoke.subscription.resumed"]
            assert resumed == [{"name": "deploys", "reason": "deploy", "version": v2}]
            assert (await s.subscription("operators")).halted is not None

        # The version is the code's (after the deploy version when there is one).
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True,
                             deploy_version="v7", **FAST) as y:
            assert y.deliveries.version == f"v7+{v2}"


def test_the_code_version_is_its_contents_not_its_place(tmp_path) -> None:
    for place in ("a", "b"):
        (tmp_path / place / "pkg" / "sub").mkdir(parents=True)
        (tmp_path / place / "pkg" / "__init__.py").write_text("x = 1\n")
        (tmp_path / place / "pkg" / "sub" / "m.py").write_text("y = 2\n")
    a, b = (sorted((tmp_path / p / "pkg").rglob("*.py")) for p in ("a", "b"))
    assert code_version(a) == code_version(b)
    (tmp_path / "b" / "pkg" / "sub" / "m.py").write_text("y = 3\n")
    assert code_version(a) != code_version(b)
    (tmp_path / "b" / "pkg" / "sub" / "m.py").rename(tmp_path / "b" / "pkg" / "m.py")
    (tmp_path / "b" / "pkg" / "m.py").write_text("y = 2\n")
    assert code_version(a) != code_version(sorted((tmp_path / "b" / "pkg").rglob("*.py")))


NODE_APP = """
from pathlib import Path
from yoke import App, Filter

app = App()
app.node_actor("js", Path(__file__).parent / "actor.mjs", filter=Filter(types=["go"]))
"""
NODE_ACTOR = """
export async function process(ctx) {
  await ctx.state.update((s) => ({ runs: (s.runs ?? 0) + 1, version: %d, pid: globalThis.process.pid }));
}
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (make test has it)")
async def test_reload_watches_node_actors_scripts(fresh_url: str, tmp_path, package) -> None:
    """A changed Node actor script is new code too: new Node hosts, a new
    deploy version."""
    name, module = package
    module.write_text(NODE_APP)
    script = module.parent / "actor.mjs"
    script.write_text(NODE_ACTOR % 1)
    app = load_app(f"{name}:app")
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, host_processes=1) as y:
        instances = y.instances("acme")
        inst = await instances.create("js", key="a")
        await y.stream("/", "acme").append({"type": "go"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["version"] == 1
        first_version = y.deliveries.version
        assert first_version == code_version([module, script])
        pool = y.executor.pools["node"]

        rewrite(script, NODE_ACTOR % 2)
        await eventually(lambda: _async(pool.generation == 1 and y.deliveries.version != first_version))
        await y.stream("/", "acme").append({"type": "go"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["version"] == 2 and state["runs"] == 2 and y.deliveries.version == code_version([module, script])


DEFINED = '''
from pathlib import Path
from yoke import App, Filter

print("loading the application")  # on stdout, before --reload's definitions: not in their way

app = App()


@app.actor("py", filter=Filter(types={types!r}), isolation="process")
async def py(ctx, event):
    await ctx.state.update(lambda s: {{"seen": [*s.get("seen", []), event.type], "version": {version}}})


app.node_actor("js", Path(__file__).parent / "js.mjs", filter=Filter(types={types!r}))
'''
SCRIPT = '''
export async function process(ctx, event) {{
  await ctx.state.update((s) => ({{ seen: [...(s.seen ?? []), event.type], version: {version} }}));
}}
'''


async def test_reload_applies_code_and_refuses_changed_definitions_loudly(
    fresh_url: str, tmp_path, package, caplog: pytest.LogCaptureFixture,
) -> None:
    """A type added to the filters of a Python and a Node actor: the new
    code runs (new hosts), the definitions are refused with the reason (in
    the log, at once) and the routing stays as it started: never silently."""
    name, module = package
    script = module.parent / "js.mjs"
    module.write_text(DEFINED.format(types=["a"], version=1))
    script.write_text(SCRIPT.format(version=1))
    app = load_app(f"{name}:app")
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, host_processes=1) as y:
        instances = y.instances("acme")
        py = await instances.create("py", key="k")
        js = await instances.create("js", key="k")
        pools = {p: y.executor.pools[p] for p in ("python", "node")}

        rewrite(module, DEFINED.format(types=["a", "b"], version=2))
        rewrite(script, SCRIPT.format(version=2))
        await eventually(lambda: _async(all(p.generation == 1 for p in pools.values())))
        assert y.code is not None and y.code.refused is not None
        assert "actor 'js': filter" in y.code.refused and "actor 'py': filter" in y.code.refused
        assert any("not applied" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)

        await y.stream("/", "acme").append({"type": "a"})
        await y.stream("/", "acme").append({"type": "b"})  # the refused filter would take it
        await y.wait_idle(timeout_s=WAIT_S)
        for inst in (py, js):
            state, _ = await instances.state(inst.instance_id)
            assert state == {"seen": ["a"], "version": 2}  # the new code, the old routing


async def test_reload_applies_nothing_of_an_application_that_does_not_load(fresh_url: str, tmp_path, package) -> None:
    name, module = package
    (module.parent / "js.mjs").write_text(SCRIPT.format(version=1))
    module.write_text(DEFINED.format(types=["a"], version=1))
    app = load_app(f"{name}:app")
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, host_processes=1) as y:
        before = y.code.version
        rewrite(module, DEFINED.format(types=["a"], version=2) + "\ndef broken(:\n")
        await eventually(lambda: _async(y.code.refused is not None))
        assert "does not load" in y.code.refused and "SyntaxError" in y.code.refused
        assert y.code.version == before and y.executor.pools["python"].generation == 0
        instances = y.instances("acme")
        inst = await instances.create("py", key="k")
        await y.stream("/", "acme").append({"type": "a"})
        await y.wait_idle(timeout_s=WAIT_S)
        assert (await instances.state(inst.instance_id))[0] == {"seen": ["a"], "version": 1}
