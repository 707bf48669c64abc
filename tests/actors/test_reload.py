"""--reload: isolated actors pick up changed code on new hosts; no queue row
is lost or run twice (docs/hosts.md#reloading)."""

from __future__ import annotations

import os
import sys
import uuid

import yoke
from tests.actors.test_isolation import WAIT_S, eventually
from yoke.actors.app import load_app

SOURCE = '''
import os
from yoke import App, Filter

app = App()


@app.actor("versioned", filter=Filter(types=["go"]), isolation="process")
async def versioned(ctx, event):
    await ctx.state.update(lambda s: {{"runs": s.get("runs", 0) + 1, "version": {version}, "pid": os.getpid()}})
'''


async def test_reload_runs_new_code_on_new_hosts(fresh_url: str, tmp_path) -> None:
    package = f"reloadapp_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code" / package
    folder.mkdir(parents=True)
    module = folder / "__init__.py"
    module.write_text(SOURCE.format(version=1))
    sys.path.insert(0, str(folder.parent))
    try:
        app = load_app(f"{package}:app")
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), reload=True, host_processes=2) as y:
            instances = y.instances("acme")
            inst = await instances.create("versioned", key="a")
            await y.stream("/", "acme").append({"type": "go"})
            await y.wait_idle(timeout_s=WAIT_S)
            state, _ = await instances.state(inst.instance_id)
            assert state["version"] == 1 and state["runs"] == 1
            old_pid = state["pid"]
            pool = y.executor.hosts

            module.write_text(SOURCE.format(version=2))
            stat = module.stat()
            os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
            await eventually(lambda: _async(
                pool.generation == 1 and len(pool.hosts) == 2 and all(h.generation == 1 for h in pool.hosts)
            ))
            await y.stream("/", "acme").append({"type": "go"})
            await y.wait_idle(timeout_s=WAIT_S)
            state, _ = await instances.state(inst.instance_id)
            assert state["version"] == 2 and state["runs"] == 2  # each row ran once
            assert state["pid"] != old_pid
            assert (await instances.depth(inst.instance_id)).dead == 0
    finally:
        sys.path.remove(str(folder.parent))


async def _async(value):
    return value
