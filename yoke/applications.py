"""Loading an application: a Python ``module:attribute`` naming a
``yoke.App``, or a JavaScript module (compiled TypeScript) whose default
export is ``defineApp({actors, portals, subscriptions})`` from the Node SDK
(yoke/hosts/node/README.md).

A JavaScript application is read by running Node once: it imports the
module and prints what it declares (its manifest: actors with their
filters and policies, portals, subscriptions), and an ``App`` is built
from that with the same validation a Python one gets (filters compiled,
names and policies checked). Its actors and portals run in the Node host,
which takes each actor's ``process`` and each portal's ``handle`` and
methods from the same module (actors/node_calls.py).

``python -m yoke.applications SPEC`` prints ``App.definitions()`` of the
application as its files are now: what ``--reload`` compares
(hosts/reload.py), in a process of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from . import errors
from .actors.app import App, load_app
from .actors.node_calls import node_portal_def, node_receiver
from .subscriptions.receivers import call, copy_to_stream, secret_from_env, secret_from_setting, webhook

SCRIPT_SUFFIXES = (".js", ".mjs", ".cjs")
MANIFEST_TIMEOUT_S = 60.0
MARK = "@@yoke-manifest@@"

# Run by Node: import the module, print its definitions after MARK (what
# the module itself prints at import comes before).
MANIFEST_JS = f"""
import {{ pathToFileURL }} from "node:url";
const module = await import(pathToFileURL(process.argv[1]).href);
const app = module.default;
if (app === null || typeof app !== "object" || typeof app.actors !== "object") {{
  console.error("its default export is not defineApp({{ actors: ... }})");
  process.exit(2);
}}
const actors = {{}};
for (const [name, actor] of Object.entries(app.actors)) {{
  const {{ process: fn, ...rest }} = actor ?? {{}};
  actors[name] = {{ ...rest, has_process: typeof fn === "function" }};
}}
process.stdout.write("\\n{MARK}" + JSON.stringify({{
  name: app.name ?? null, version: app.version ?? null, actors,
  subscriptions: app.subscriptions ?? [],
  receivers: Object.fromEntries(Object.entries(app.receivers ?? {{}}).map(([name, fn]) => [name, typeof fn === "function"])),
  portals: Object.fromEntries(Object.entries(app.portals ?? {{}}).map(([name, portal]) => [name, {{
    tenant: portal?.tenant ?? "default", methods: Object.keys(portal?.methods ?? {{}}),
    has_handle: typeof portal?.handle === "function", has_start: typeof portal?.start === "function",
  }}])),
}}) + "\\n", () => process.exit(0));  // timers or servers the module started must not keep it alive
"""

ACTOR_OPTIONS = {"filter", "concurrency", "max_attempts", "timeout_s", "singleton", "retry_base_s", "retry_max_s",
                 "effects"}
SUBSCRIPTION_OPTIONS = {"source", "name", "receiver", "tenant", "filter", "transform", "start", "on_failing_event"}


def is_script(spec: str) -> bool:
    return spec.endswith(SCRIPT_SUFFIXES)


def load(spec: str) -> App:
    """The application ``spec`` names: ``module:attribute`` (Python) or the
    path of a JavaScript module (``app.js``, ``dist/app.mjs``)."""
    return load_script(spec) if is_script(spec) else load_app(spec)


def load_script(path: str) -> App:
    script = os.path.abspath(path)
    if not os.path.isfile(script):
        raise errors.InvalidInput(f"the application {path} does not exist", field="app")
    node = shutil.which("node")
    if node is None:
        raise errors.InvalidInput(f"the application {path} is JavaScript, and there is no node on PATH", field="app")
    try:
        done = subprocess.run(
            [node, "--enable-source-maps", "--input-type=module", "-e", MANIFEST_JS, script],
            capture_output=True, text=True, timeout=MANIFEST_TIMEOUT_S, cwd=os.path.dirname(script),
        )
    except subprocess.TimeoutExpired:
        raise errors.InvalidInput(f"cannot load {path}: importing it took over {MANIFEST_TIMEOUT_S:.0f}s") from None
    if done.returncode != 0 or MARK not in done.stdout:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = next((line for line in lines if re.match(r"\s*\w*Error\b", line)),  # Node's "Error: ..." line
                      lines[-1] if lines else f"exit {done.returncode}")
        raise errors.InvalidInput(f"cannot load {path}: {reason.strip()}", field="app")
    return app_from_manifest(orjson.loads(done.stdout.rsplit(MARK, 1)[1]), script)


def app_from_manifest(manifest: dict[str, Any], script: str) -> App:
    """The App a JavaScript application's manifest declares, its actors run
    by the Node host from ``script``."""
    app = App(name=str(manifest.get("name") or Path(script).stem), version=manifest.get("version"), spec=script)
    actors = manifest.get("actors")
    if not isinstance(actors, dict) or not actors:
        raise errors.InvalidInput("defineApp({ actors }) names at least one actor", field="actors")
    for name, options in actors.items():
        if not options.pop("has_process", False):
            raise errors.InvalidInput(f"actor {name!r}: it has no process(ctx, event) function", field="actors")
        unknown = set(options) - ACTOR_OPTIONS
        if unknown:
            raise errors.InvalidInput(
                f"actor {name!r}: unknown option(s) {', '.join(sorted(unknown))}; an actor takes"
                f" {', '.join(sorted(ACTOR_OPTIONS))} and process", field="actors",
            )
        app.node_actor(name, script, **options)
    for name, portal in (manifest.get("portals") or {}).items():
        if not portal.get("has_handle"):
            raise errors.InvalidInput(f"portal {name!r}: it has no handle(ctx, request) function", field="portals")
        app.add_portal(node_portal_def(name, script, portal.get("tenant") or "default", portal.get("methods") or [],
                                       loop=bool(portal.get("has_start"))))
    for name, is_function in (manifest.get("receivers") or {}).items():
        if not is_function:
            raise errors.InvalidInput(f"receiver {name!r}: it is not a function (batch) => ...", field="receivers")
        app.receiver(name)(node_receiver(app, name))
    subscriptions = manifest.get("subscriptions") or []
    if not isinstance(subscriptions, list):
        raise errors.InvalidInput("subscriptions is a list", field="subscriptions")
    for declared in subscriptions:
        if not isinstance(declared, dict) or set(declared) - SUBSCRIPTION_OPTIONS:
            raise errors.InvalidInput(
                f"a subscription takes {', '.join(sorted(SUBSCRIPTION_OPTIONS))}", field="subscriptions"
            )
        options = dict(declared)
        source, name = options.pop("source", None), options.pop("name", None)
        app.subscription(source, name, receiver_of(options.pop("receiver", None), app), **options)
    return app


def receiver_of(spec: Any, app: App) -> Any:
    """A declared subscription's receiver: {kind: "copy", target},
    {kind: "webhook", url, secret_env | secret_setting} or {kind: "call",
    function} naming one of the application's receivers."""
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind == "copy" and set(spec) <= {"kind", "target"}:
        return copy_to_stream(spec.get("target"))
    if kind == "call" and set(spec) <= {"kind", "function"}:
        if spec.get("function") not in app.receivers:
            raise errors.InvalidInput(
                f"a call subscription names one of defineApp's receivers, not {spec.get('function')!r}", field="receiver"
            )
        return call(spec["function"])
    if kind == "webhook" and set(spec) <= {"kind", "url", "secret_env", "secret_setting"}:
        if "secret_env" in spec:
            return webhook(spec.get("url"), secret=secret_from_env(spec["secret_env"]))
        if "secret_setting" in spec:
            return webhook(spec.get("url"), secret=secret_from_setting(spec["secret_setting"]))
        raise errors.InvalidInput("a declared webhook names its secret: secret_env or secret_setting", field="receiver")
    raise errors.InvalidInput(
        'a JavaScript application\'s subscription receiver is {kind: "copy", target}, {kind: "webhook", url,'
        ' secret_env | secret_setting} or {kind: "call", function} (processors are Python\'s)', field="receiver",
    )


def main() -> None:
    definitions = orjson.dumps(load(sys.argv[1]).definitions()).decode()
    print(f"\n{MARK}{definitions}")  # after MARK: what the application printed on import comes before


if __name__ == "__main__":
    main()
