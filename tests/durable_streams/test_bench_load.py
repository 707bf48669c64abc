"""The side-by-side bench's load generator (bench/durable_streams_load.mjs)
still drives a Yoke server over the protocol: each scenario, briefly, on
both backends, and what it wrote is in the streams. Its figures are the
bench's business (bench/durable_streams.py), not this test's."""

from __future__ import annotations

import json
import subprocess
import uuid

import httpx
import pytest

from tests.durable_streams.conftest import HERE, node_modules
from tests.http.conftest import ROOT, Server

LOAD = ROOT / "bench" / "durable_streams_load.mjs"


def _load(server: Server, scenario: str, run: str, *options: str) -> dict:
    node_modules()
    done = subprocess.run(
        ["node", str(LOAD), server.url, scenario, f"run={run}", *options],
        cwd=HERE, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario, batch", [("a", 1), ("b", 100)])
def test_writers_append_what_they_count(dev_server: Server, scenario: str, batch: int) -> None:
    run = "load-" + uuid.uuid4().hex[:8]
    result = _load(dev_server, scenario, run, "seconds=0.5", "streams=3", "producers=4")
    assert result["scenario"] == scenario
    assert result["requests"] > 0 and result["messages"] == result["requests"] * batch
    stored = []
    for i in range(3):
        offset = "-1"
        while True:  # page by page (1,000 messages a page)
            answer = httpx.get(f"{dev_server.url}/v1/stream/{run}-{scenario}-{i}", params={"offset": offset})
            assert answer.status_code == 200
            stored += answer.json()
            offset = answer.headers["stream-next-offset"]
            if answer.headers.get("stream-up-to-date") == "true":
                break
    assert len(stored) == result["messages"]
    assert {len(json.dumps(m, separators=(",", ":"))) for m in stored} == {256}


def test_readers_read_every_message_from_the_start(dev_server: Server) -> None:
    result = _load(dev_server, "c", "load-" + uuid.uuid4().hex[:8], "streams=2", "readers=3", "messages=250")
    assert (result["scenario"], result["messages"], result["requests"]) == ("c", 750, 3)
