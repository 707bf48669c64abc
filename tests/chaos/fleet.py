"""Real `yoke serve` and `yoke worker` processes on one PostgreSQL database,
for the tests that need separate processes (membership, state storage):
each with its own environment and data directory, its log in a file, its
`--json` announcement read from stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import PG_ADMIN_URL, admin_sql, with_database

REPO_ROOT = Path(__file__).resolve().parents[2]
START_S = 60.0  # a process announces itself within this


@contextlib.asynccontextmanager
async def pg_database(prefix: str) -> AsyncIterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await admin_sql(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(PG_ADMIN_URL, name)
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path
    announced: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)


class Fleet:
    def __init__(self, url: str, folder: Path, **env: str) -> None:
        self.url = url
        self.folder = folder
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "YOKE_DATABASE_URL": url,
                    "YOKE_ACCESS_LOG": "0", **env}
        self.processes: list[Process] = []

    def start(self, name: str, *args: str, announce: bool = True, **env: str) -> Process:
        """``yoke <args> --json`` with ``env`` added; waits for its JSON line
        (unless ``announce`` is False: a process expected to refuse)."""
        log = self.folder / f"{name}.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", *args, "--json"], cwd=REPO_ROOT, env={**self.env, **env},
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        )
        process = Process(name, popen, log)
        self.processes.append(process)
        if announce:
            ready, _, _ = select.select([popen.stdout], [], [], START_S)
            line = popen.stdout.readline() if ready else ""  # type: ignore[union-attr]
            assert line, f"{name} announced nothing within {START_S}s:\n{process.text()[-3000:]}"
            process.announced = json.loads(line)
        return process

    def worker(self, name: str, app: str, **env: str) -> Process:
        return self.start(name, "worker", "--app", app, **env)

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.text()[-chars:]}" for p in self.processes)

    def stop(self, timeout_s: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every process still running (SIGCONT first, in case it
        was stopped), then SIGKILL what is left; each one's exit code."""
        for p in self.processes:
            if p.popen.poll() is None:
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(max(deadline - time.monotonic(), 0.1))
        codes = {}
        for p in self.processes:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
            codes[p.name] = p.popen.returncode
        return codes


async def until(what: str, check: Callable[[], Any], timeout_s: float, fleet: Fleet | None = None) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}\n{fleet.logs() if fleet else ''}")
        await asyncio.sleep(0.1)
