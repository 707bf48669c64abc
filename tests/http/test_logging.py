"""serve's one logging setup, against a real ``yoke serve`` and its stderr:
timestamps and levels on every line (uvicorn's and Yoke's own), Yoke's INFO
lines kept, --log-level, --log-format json, and request ids (X-Request-ID
accepted or made, echoed, on the access line and on lines logged while the
request was handled)."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx
import orjson

from .conftest import ROOT, Server, start_server, stop_server

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
APP = {"PYTHONPATH": str(ROOT), "YOKE_ACCESS_LOG": "1"}


def log_of(server: Server) -> Path:
    return server.data_dir.parent / f"server-{server.url.rsplit(':', 1)[1]}.log"


def malformed(server: Server) -> bytes:
    """A request that is not HTTP: the connection layer answers 400 and logs a warning."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        return s.recv(4096)


def wait_for_line(log: Path, pattern: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, log.read_text(), re.M)
        if found:
            return found.group(0)
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in:\n{log.read_text()}"
        time.sleep(0.05)


def test_text_lines_have_time_and_level_and_yoke_info_lines_are_kept(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", **APP)
    try:
        http = server.client()
        assert http.put("/v1/streams/logs", json={"retention": {"max_events": 1}}).status_code == 201
        assert http.post("/v1/streams/logs/-/events", json=[{"type": "x"}] * 3).status_code == 201
        log = log_of(server)
        # An INFO line of Yoke's own (docs/production/faults.md's kind): it was dropped before.
        wait_for_line(log, rf"^{STAMP} INFO yoke\.streams\.retention: retention removed \d+ events$")
        # A warning of Yoke's own: it had no time and no level.
        assert malformed(server).startswith(b"HTTP/1.1 400")
        wait_for_line(log, rf"^{STAMP} WARNING yoke\.http: malformed_request: ")
        # uvicorn's lines, and the access line with its request id.
        answer = http.get("/v1/streams", headers={"X-Request-ID": "trace-7"})
        assert answer.headers["x-request-id"] == "trace-7"
        wait_for_line(log, rf"^{STAMP} INFO uvicorn\.access \[req trace-7\]: .*\"GET /v1/streams HTTP/1.1\" 200$")
        wait_for_line(log, rf"^{STAMP} INFO uvicorn\.error: Application startup complete\.$")
    finally:
        stop_server(server)


def test_log_level_warning_leaves_out_info_lines(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", args=("--log-level", "warning"),
                          **APP)
    try:
        server.client().get("/v1/streams")
        assert malformed(server).startswith(b"HTTP/1.1 400")
        log = log_of(server)
        wait_for_line(log, rf"^{STAMP} WARNING yoke\.http: malformed_request: ")
    finally:
        stop_server(server)
    text = log.read_text()
    assert " INFO " not in text and "uvicorn.access" not in text


def test_json_lines_and_request_ids(tmp_path: Path) -> None:
    server = start_server(
        f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke",
        args=("--app", "tests.http.logging_app:app", "--log-format", "json"), **APP,
    )
    try:
        given = httpx.post(server.url + "/v1/portals/say", json={"n": 1}, headers={"X-Request-ID": "abc-123"})
        assert given.status_code == 200 and given.headers["x-request-id"] == "abc-123"
        made = httpx.get(server.url + "/healthz")
        made_id = made.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{16}", made_id)
        # One that would break a log line (a space; too long) is replaced.
        for bad in ("two words", "x" * 129):
            replaced = httpx.get(server.url + "/healthz", headers={"X-Request-ID": bad}).headers["x-request-id"]
            assert re.fullmatch(r"[0-9a-f]{16}", replaced)
        # The Durable Streams protocol's answers (raw ASGI) carry one too.
        assert httpx.head(server.url + "/v1/stream/nothing").headers["x-request-id"]
        assert malformed(server).startswith(b"HTTP/1.1 400")
        wait_for_line(log_of(server), r'"path":"/v1/stream/nothing"')
    finally:
        stop_server(server)
    lines = log_of(server).read_text().splitlines()
    entries = [orjson.loads(line) for line in lines]  # every line is JSON: the banner too
    for entry in entries:
        assert re.fullmatch(STAMP, entry["time"]) and entry["level"] in ("INFO", "WARNING") and entry["logger"]
    said = [e for e in entries if e["logger"] == "tests.logging_app"]
    assert [(e["message"], e["request_id"], e["level"]) for e in said] == [
        ("portal heard {'n': 1}", "abc-123", "WARNING")
    ]
    access = {(e["path"], e["status"]): e for e in entries if e["logger"] == "uvicorn.access"}
    assert access[("/v1/portals/say", 200)]["request_id"] == "abc-123"
    assert access[("/healthz", 200)]["method"] == "GET"
    assert made_id in {e.get("request_id") for e in entries}
    assert any(e["logger"] == "yoke.http" and e["message"].startswith("malformed_request") for e in entries)
    assert any(e["logger"] == "yoke.cli" and e["message"].startswith("Yoke is serving") for e in entries)
