"""``--reload``: new hosts when the application's code changes.

Polls the modification times of the application's Python files (its
top-level package, or its module file alone when it has no package); on a
change the pool recycles (pool.py): runs in progress finish on the hosts
they started on, every later run goes to a new host that imports the code
afresh. Queue rows are not touched, so none is lost or run twice. Only
isolated actors pick up new code: the kernel keeps the App it started with
(actors, filters, in-process handlers).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from .pool import HostPool

log = logging.getLogger("yoke.hosts.reload")

POLL_S = 0.5


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


async def watch(pool: HostPool, app_spec: str) -> None:
    files = watched_files(app_spec)
    last = snapshot(files)
    while True:
        await asyncio.sleep(POLL_S)
        files = watched_files(app_spec) if files else files
        now = snapshot(files)
        if now != last:
            changed = sorted(str(f) for f in set(now) | set(last) if now.get(f) != last.get(f))
            log.info("code changed (%s): new hosts for new runs", ", ".join(changed[:5]))
            last = now
            pool.recycle()
