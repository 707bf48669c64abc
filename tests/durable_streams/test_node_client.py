"""The protocol's TypeScript client (npm ``@durable-streams/client``, the
version the conformance suite pins) driving Yoke streams over ``yoke serve
--dev`` on both backends: create, append, catch-up, resume from an offset,
live reads (long-poll and SSE), bytes, and its idempotent producer
(clients.test.js, run with vitest)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.durable_streams.conftest import HERE, node_modules


def test_node_client(dev_server, tmp_path) -> None:
    node_modules()
    report = tmp_path / "report.json"
    run = subprocess.run(
        ["npx", "--no-install", "vitest", "run", "clients", "--reporter=json", f"--outputFile={report}"],
        cwd=HERE, env={**os.environ, "DS_BASE_URL": dev_server.url, "CI": "1"},
        capture_output=True, text=True, timeout=300,
    )
    assert report.exists(), run.stdout[-5000:] + run.stderr[-5000:]
    results = [t for f in json.loads(report.read_text())["testResults"] for t in f["assertionResults"]]
    failed = [f"{t['title']}: {(t.get('failureMessages') or [''])[0][:1500]}" for t in results if t["status"] != "passed"]
    assert len(results) == 5 and not failed, "\n".join(failed) or run.stdout[-3000:]
