"""``--reload``: the application's code, its version, and a watch for changes.

The code is the application's Python files (its top-level package, or its
module file alone when it has no package) and the scripts of its Node
actors. Its version is a hash of their
contents, so the same code always has the same version and any change to it
a new one. The watch polls modification times and, when the contents'
hash changes, emits the ``code_changed`` signal: the executor recycles its
host pools (pool.py: runs in progress finish on the hosts they started on,
every later run goes to a new host that imports the code afresh; queue rows
are not touched, so none is lost or run twice) and the subscriptions take
the hash as their new deploy version (halted ones resume under it). Only
isolated actors pick up new code: the kernel keeps the App it started with,
so a change to what the App declares is refused, loudly (``CodeWatch``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("yoke.hosts.reload")

POLL_S = 0.5
LOAD_TIMEOUT_S = 60.0  # loading a changed application to read its definitions
MARK = "@@yoke-manifest@@"  # yoke.applications prints the definitions after it
VERSION_PREFIX = "code:"


def watched_files(app_spec: str) -> list[Path]:
    module_name = app_spec.partition(":")[0]
    top = sys.modules.get(module_name.split(".")[0])
    path = getattr(top, "__file__", None)
    if path is None:
        return []
    path = Path(path)
    if path.name == "__init__.py":
        return sorted(path.parent.rglob("*.py"))
    return [path]


def snapshot(files: list[Path]) -> dict[Path, int]:
    times = {}
    for f in files:
        try:
            times[f] = f.stat().st_mtime_ns
        except OSError:
            times[f] = -1
    return times


def code_version(files: list[Path]) -> str:
    """``code:`` and 12 hex digits of a hash of the files' contents and
    their names relative to the code's folder (not where it is checked out:
    every worker running the same code has the same version)."""
    digest = hashlib.sha256()
    root = Path(os.path.commonpath(files)) if len(files) > 1 else None
    for f in sorted(files):
        try:
            content = f.read_bytes()
        except OSError:
            content = b"\0missing"
        name = (f.relative_to(root).as_posix() if root else f.name).encode()
        digest.update(len(name).to_bytes(4, "big") + name + len(content).to_bytes(8, "big") + content)
    return VERSION_PREFIX + digest.hexdigest()[:12]


class CodeWatch:
    """The application's code files: their version now, and a loop that
    calls ``on_change(version)`` when their contents change.

    ``definitions``: what the running application declares
    (``App.definitions``). A change is loaded in a process of its own first:
    one that does not load is not applied at all; one that changes the
    definitions (a filter, an actor added or removed, a portal, a
    subscription) has its code applied (hosts import the files as they are)
    and its definitions refused, loudly, until a restart. ``inprocess``: actors that run in the kernel's event
    loop, which keep the code they started with (said at each change)."""

    def __init__(
        self, app_spec: str, scripts: list[str] | None = None, *,
        definitions: dict[str, Any] | None = None, inprocess: list[str] | None = None,
    ) -> None:
        self.app_spec = app_spec
        self.scripts = [Path(s) for s in scripts or []]  # other languages' actors (app.node_actor)
        self.files = self._files()
        self._times = snapshot(self.files)
        self.version = code_version(self.files)
        self.definitions = definitions
        self.inprocess = sorted(inprocess or [])
        self.refused: str | None = None  # what the last change could not apply (None: all of it)

    def _files(self) -> list[Path]:
        return sorted(set(watched_files(self.app_spec)) | set(self.scripts))

    async def run(self, on_change: Callable[[str], None]) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.check(on_change)
            except asyncio.CancelledError:
                raise
            except Exception:  # the watch goes on: the next change is looked at again
                log.exception("--reload: looking at the changed code failed")

    async def check(self, on_change: Callable[[str], None]) -> None:
        files = self._files()  # a new file in the package counts
        times = snapshot(files)
        if times == self._times:
            return
        changed = sorted(str(f) for f in set(times) | set(self._times) if times.get(f) != self._times.get(f))
        self.files, self._times = files, times
        version = code_version(files)
        if version == self.version:
            return  # touched, not changed
        self.refused = None
        if self.definitions is not None:
            loaded = await load_definitions(self.app_spec)
            if isinstance(loaded, str):
                self.refused = f"the changed application does not load: {loaded}"
                log.error("--reload: %s; nothing of the change is applied, the running code stays", self.refused)
                return
            differences = describe_changes(self.definitions, loaded)
            if differences:
                self.refused = f"the application's definitions changed ({'; '.join(differences)})"
                log.error("--reload: %s: not applied, they take effect when the server restarts;"
                          " the handlers' code is applied", self.refused)
        log.info("code changed (%s): version %s, new hosts for new runs", ", ".join(changed[:5]), version)
        if self.inprocess:
            log.warning("--reload: in-process actors keep the code they started with (%s): give them"
                        " isolation='process' to reload them, or restart", ", ".join(self.inprocess))
        self.version = version
        on_change(version)


async def load_definitions(app_spec: str) -> dict[str, Any] | str:
    """The definitions of the application as its files are now, loaded in a
    process of its own (``python -m yoke.applications``); what went wrong, as
    text, when it does not load."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "yoke.applications", app_spec,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        async with asyncio.timeout(LOAD_TIMEOUT_S):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"loading it took over {LOAD_TIMEOUT_S:.0f}s"
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit status {proc.returncode}"
    _, mark, definitions = out.decode(errors="replace").rpartition(MARK)
    if not mark:
        return "it printed no definitions"
    return orjson.loads(definitions)


def describe_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two ``App.definitions``, in words."""
    said: list[str] = []
    for part in ("actors", "portals", "subscriptions"):
        old, new = before.get(part, {}), after.get(part, {})
        kind = part[:-1]
        said += [f"{kind} {name!r} added" for name in sorted(set(new) - set(old))]
        said += [f"{kind} {name!r} removed" for name in sorted(set(old) - set(new))]
        for name in sorted(set(old) & set(new)):
            if old[name] != new[name]:
                if isinstance(old[name], dict):
                    fields = sorted(k for k in set(old[name]) | set(new[name]) if old[name].get(k) != new[name].get(k))
                    said.append(f"{kind} {name!r}: {', '.join(fields)}")
                else:
                    said.append(f"{kind} {name!r} changed")
    for part in ("receivers", "processors"):
        if before.get(part) != after.get(part):
            said.append(f"{part} {sorted(set(before.get(part, [])) ^ set(after.get(part, [])))}")
    return said
