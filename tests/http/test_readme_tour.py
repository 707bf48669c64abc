"""The README's five-minute tour, run as written: every shell line of the
tour, by bash, with real curl and the real CLI, against `yoke serve --app
yoke.examples.orders:app` (what `make run` starts), on both backends.

Only the port differs (a free one instead of 8080), and `.venv/bin/yoke`
is this interpreter's CLI. Where a line depends on work the server does in
the background (an actor creating its instance), the test waits for that
condition first, as a reader would by reading the previous output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import own_database, start_server, stop_server

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_lines() -> list[str]:
    """The shell lines of the tour, continuation lines joined, comments and
    `make run` (started by the test) left out."""
    tour = README.read_text().split("## A five-minute tour", 1)[1].split("**From Python.**", 1)[0]
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", tour, re.S):
        pending = ""
        for raw in block.splitlines():
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            line = (pending + raw).strip()
            pending = ""
            if line and not line.startswith("#") and line != "make run":
                lines.append(line)
    return lines


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_tour_runs_as_written(backend, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    lines = tour_lines()
    assert any(line.startswith("curl") for line in lines) and any(".venv/bin/yoke" in line for line in lines)
    with own_database(backend, tmp_path, "yoke_tour") as db_url:
        # From the repository root, as the README runs it (the install maps only yoke).
        server = start_server(db_url, tmp_path / ".yoke", args=("--app", "yoke.examples.orders:app"),
                              PYTHONPATH=str(README.parent))
        try:
            run_tour(server, lines, tmp_path)
        finally:
            stop_server(server)


def run_tour(server, lines: list[str], home: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    venv_bin = home / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "yoke").write_text(f'#!/bin/sh\nexec {sys.executable} -m yoke.cli "$@"\n')
    (venv_bin / "yoke").chmod(0o755)
    env = {**os.environ, "YOKE_URL": server.url}
    env.pop("YOKE_TOKEN", None)
    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=10)

    def order_instance_exists() -> bool:
        found = api.get("/v1/instances", params={"actor": "order", "key": "A-1"}).json()["instances"]
        return bool(found)

    before = {"instances": order_instance_exists}
    outputs: dict[str, str] = {}
    for line in lines:
        command = line.replace("localhost:8080", f"127.0.0.1:{port}").replace("token-8080", f"token-{port}")
        for marker, condition in before.items():
            if f"yoke {marker}" in command:
                wait_for(condition, f"the condition before {line!r}")
        done = subprocess.run(
            ["bash", "-c", command], cwd=home, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        outputs[line] = done.stdout
    api.close()

    def output_of(fragment: str) -> str:
        return next(out for line, out in outputs.items() if fragment in line)

    assert '"offset":1' in output_of("-d '{\"type\": \"hello\"")
    assert "note.added" in output_of("yoke read /demo")
    assert "/demo" in output_of("yoke streams")
    closed_tail = output_of("yoke tail /demo")
    assert "hello" in closed_tail and "note.added" in closed_tail
    assert output_of("yoke stream delete /demo").startswith("deleted /demo (stream id str_")
    assert '"order_id":"A-1"' in output_of("portals/shop/orders")
    assert "order.placed" in output_of("yoke read /orders/A-1")
    assert "payments" in output_of("yoke instances list")
    assert "state" in output_of("yoke instances show order/A-1")
    archive = output_of("yoke read /archive/A-1")
    assert "order.placed" in archive and "yoke.subscription" not in archive
    assert "archive" in output_of("yoke subscriptions list")
