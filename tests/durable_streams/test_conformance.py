"""The official Durable Streams conformance suite
(``@durable-streams/server-conformance-tests``, pinned in package.json) run
with vitest against ``yoke serve --dev``, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.durable_streams.conftest import HERE, LONG_POLL_S, node_modules



# The suite's TTL tests leave a server 500 ms of slack: a stream with a
# 2-second TTL, read after 1.5 s, must still be there 1.5 s after that read
# answered. On the 2-core machine running three test workers beside
# PostgreSQL, one request's latency once passed that. A run whose only
# failures are among them runs those again, alone, once: a TTL bug fails
# both times.
TIMING_BOUND = "TTL Expiration Behavior > "


def _run_suite(dev_server, report: Path, only: list[str] | None = None) -> dict[str, tuple[str, list[str]]]:
    """Each test's (status, failure messages), by its full name."""
    env = {**os.environ, "DS_BASE_URL": dev_server.url, "DS_LONG_POLL_MS": str(LONG_POLL_S * 1000), "CI": "1"}
    pattern = ["-t", "|".join(re.escape(name.replace(" > ", " ")) for name in only)] if only else []
    run = subprocess.run(
        ["npx", "--no-install", "vitest", "run", "conformance", *pattern, "--reporter=json", f"--outputFile={report}"],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )
    assert report.exists(), run.stdout[-5000:] + run.stderr[-5000:]
    results = json.loads(report.read_text())
    outcomes: dict[str, tuple[str, list[str]]] = {}
    for file in results["testResults"]:
        for test in file["assertionResults"]:
            name = " > ".join([*test["ancestorTitles"], test["title"]])
            outcomes[name] = (test["status"], test.get("failureMessages") or [])
    return outcomes


def test_conformance_suite(dev_server, tmp_path) -> None:
    node_modules()
    outcomes = _run_suite(dev_server, tmp_path / "report.json")
    assert len(outcomes) == 338, f"the suite ran {len(outcomes)} tests"
    failed = {name: messages for name, (status, messages) in outcomes.items() if status == "failed"}
    if failed and all(name.startswith(TIMING_BOUND) for name in failed):
        again = _run_suite(dev_server, tmp_path / "again.json", only=list(failed))
        for name in [n for n in failed if again.get(n, ("missing",))[0] == "passed"]:
            print(f"passed when run again alone: {name}\n    {failed.pop(name)[0][:300]}")
            outcomes[name] = ("passed", [])
    report_lines = [f"{name}\n    {messages[0][:600] if messages else ''}" for name, messages in failed.items()]
    assert not failed, f"{len(failed)} conformance failures:\n" + "\n".join(report_lines)
    passed = sum(1 for status, _ in outcomes.values() if status == "passed")
    # The 6 tests of the protocol's subscription API run only with
    # subscriptions: true; Yoke does not implement that API.
    assert passed == 332, f"{passed} passed"
