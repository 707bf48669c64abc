"""The CLI over HTTP, `make run`'s banner, and graceful shutdown."""

from __future__ import annotations

import signal
import threading

import httpx
import orjson
from httpx_sse import connect_sse

from .conftest import events_url, start_server


def test_cli_stream_commands(server, path):
    out = server.cli("append", path, "order.placed", '{"id": 7}', "--url", server.url)
    assert f"appended {path} offset 1" in out.stdout
    out = server.cli("append", path, "order.paid", "--url", server.url, "--json")
    assert orjson.loads(out.stdout)["offset"] == 2
    out = server.cli("read", path, "--url", server.url)
    assert "order.placed" in out.stdout and '{"id":7}' in out.stdout
    page = orjson.loads(server.cli("read", path, "--after", "1", "--json", "--url", server.url).stdout)
    assert [e["type"] for e in page["events"]] == ["order.paid"]
    assert path in server.cli("streams", "/t/", "--url", server.url).stdout
    info = orjson.loads(server.cli("stream", "info", path, "--json", "--url", server.url).stdout)
    assert info["head"] == 2
    assert "legal hold on" in server.cli("stream", "hold", path, "on", "--url", server.url).stdout
    assert "max_events=5" in server.cli("stream", "retention", path, "--max-events", "5", "--url", server.url).stdout
    assert "closed" in server.cli("stream", "close", path, "--url", server.url).stdout
    failed = server.cli("append", path, "late", "--url", server.url, check=False)
    assert failed.returncode == 1
    assert failed.stderr.strip() == f"error: stream_closed (409): stream {path} is closed"
    bad_json = server.cli("append", path, "x", "{not json", "--url", server.url, check=False)
    assert bad_json.returncode == 1 and "not valid JSON" in bad_json.stderr
    unreachable = server.cli("read", path, "--url", "http://127.0.0.1:9", check=False)
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("error:")


def test_cli_tail(server, http, path):
    http.post(events_url(path), json=[{"type": "a"}, {"type": "b"}])
    import subprocess
    import sys
    import os

    env = {**os.environ, "YOKE_TOKEN": server.token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "tail", path, "--json", "--url", server.url],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    try:
        lines = [orjson.loads(proc.stdout.readline()) for _ in range(2)]
        http.post(events_url(path), json={"type": "c"})
        lines.append(orjson.loads(proc.stdout.readline()))
        assert [e["type"] for e in lines] == ["a", "b", "c"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_sigterm_ends_tails_and_finishes_appends(tmp_path):
    server = start_server(
        f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", YOKE_SSE_HEARTBEAT_S="30", YOKE_METRICS_TOKEN="m-secret"
    )
    # With a metrics token set, /metrics (whose labels name tenants) needs it.
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer m-secret"}).status_code == 200
    ended = threading.Event()
    first = threading.Event()

    def follow():
        with server.client() as c, connect_sse(c, "GET", events_url("/s", "tail")) as source:
            for _ in source.iter_sse():
                first.set()
        ended.set()  # the server closed the response cleanly

    with server.client() as c:
        c.post(events_url("/s"), json={"type": "x"})
        follower = threading.Thread(target=follow)
        follower.start()
        assert first.wait(20)
        server.process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal after its graceful shutdown.
        assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    log = next(tmp_path.glob("server-*.log")).read_text()
    assert "Application shutdown complete" in log
    assert ended.wait(10)
    follower.join(10)
    # Everything acknowledged before the signal is durable after restart.
    again = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    try:
        with again.client() as c:
            assert c.get(events_url("/s")).json()["events"][0]["type"] == "x"
        assert again.token == server.token  # the token file is reused
    finally:
        again.process.send_signal(signal.SIGTERM)
        again.process.wait(30)


def test_token_file_is_private(server):
    mode = server.token_file.stat().st_mode & 0o777
    assert mode == 0o600
