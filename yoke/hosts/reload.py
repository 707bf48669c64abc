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
isolated actors pick up new code: the kernel keeps the App it started with.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("yoke.hosts.reload")

POLL_S = 0.5
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
    calls ``on_change(version)`` when their contents change."""

    def __init__(self, app_spec: str, scripts: list[str] | None = None) -> None:
        self.app_spec = app_spec
        self.scripts = [Path(s) for s in scripts or []]  # other languages' actors (app.node_actor)
        self.files = self._files()
        self._times = snapshot(self.files)
        self.version = code_version(self.files)

    def _files(self) -> list[Path]:
        return sorted(set(watched_files(self.app_spec)) | set(self.scripts))

    async def run(self, on_change: Callable[[str], None]) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.check(on_change)

    def check(self, on_change: Callable[[str], None]) -> None:
        files = self._files()  # a new file in the package counts
        times = snapshot(files)
        if times == self._times:
            return
        changed = sorted(str(f) for f in set(times) | set(self._times) if times.get(f) != self._times.get(f))
        self.files, self._times = files, times
        version = code_version(files)
        if version == self.version:
            return  # touched, not changed
        log.info("code changed (%s): version %s, new hosts for new runs", ", ".join(changed[:5]), version)
        self.version = version
        on_change(version)
