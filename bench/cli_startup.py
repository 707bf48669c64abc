"""CLI start-up time: ``yoke --help``, ``yoke --version`` and ``yoke read``.

    .venv/bin/python bench/cli_startup.py [--runs 20]

Each command runs ``--runs`` times as a new process (the ``yoke`` script of
this interpreter's environment); the minimum is the figure (the machine's
noise only ever adds), the median is printed next to it. ``yoke read``
reads 10 events from a real ``yoke serve`` (SQLite, in a temporary
directory) started by this script. With hyperfine on PATH it is used
instead (``--warmup 2``; its min and median).

Targets (issue 11): ``yoke --help`` under 0.3 s, ``yoke read`` under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

YOKE = str(Path(sys.executable).with_name("yoke"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "YOKE_ACCESS_LOG": "0"}
    process = subprocess.Popen(
        [YOKE, "serve", "--port", str(port), "--json"], cwd=workdir, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    ready = json.loads(process.stdout.readline())  # one JSON line once it serves
    return process, ready["url"]


def time_runs(argv: list[str], runs: int, cwd: Path) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return times


def hyperfine(argv: list[str], runs: int, cwd: Path) -> list[float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            ["hyperfine", "--warmup", "2", "--runs", str(runs), "--export-json", out.name, "-N",
             " ".join(argv)], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
        )
        return json.loads(Path(out.name).read_text())["results"][0]["times"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    measure = hyperfine if shutil.which("hyperfine") else time_runs
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        process, url = start_server(workdir)
        try:
            request = urllib.request.Request(
                f"{url}/v1/streams/bench/-/events", method="POST",
                data=json.dumps([{"type": "tick", "payload": {"n": n}} for n in range(10)]).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Authorization": "Bearer " + (workdir / ".yoke" / f"token-{url.rsplit(':', 1)[1]}").read_text().strip(),
                },
            )
            urllib.request.urlopen(request).read()
            commands = {
                "yoke --help": [YOKE, "--help"],
                "yoke --version": [YOKE, "--version"],
                "yoke read /bench": [YOKE, "read", "/bench", "--url", url],
                "yoke read /bench --json": [YOKE, "read", "/bench", "--url", url, "--json"],
            }
            print(f"{'command':<26} {'min':>8} {'median':>8}   ({args.runs} runs, {measure.__name__})")
            for name, argv in commands.items():
                times = measure(argv, args.runs, workdir)
                print(f"{name:<26} {min(times):>7.3f}s {statistics.median(times):>7.3f}s")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


if __name__ == "__main__":
    main()
