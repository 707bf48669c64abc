"""`yoke serve` from a user's chair: a busy port, two servers in one
directory, the token files the CLI finds, and what the CLI says when the
token or the server is not there."""

from __future__ import annotations

import dataclasses
import json
import select
import signal
import subprocess
import sys

import httpx

from tests.http.conftest import free_port, start_server, stop_server
from yoke.config import Settings

from .conftest import clean_env, yoke


def test_busy_port_fails_in_one_line_before_announcing_anything(tmp_path):
    first = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    try:
        port = first.url.rsplit(":", 1)[1]
        before = first.token_file.read_text()
        done = yoke("serve", "--port", port, cwd=tmp_path, check=False, YOKE_DATABASE_URL=first.db_url)
        assert done.returncode == 1
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr  # one line: no banner, no uvicorn log, no traceback
        assert done.stderr == (
            f"error: 127.0.0.1:{port} is already in use (another Yoke server?); choose another port: "
            "`yoke serve --port N` or `make run PORT=N`\n"
        )
        # The running server lost nothing: same token file, still serving.
        assert first.token_file.read_text() == before
        assert httpx.get(first.url + "/healthz").status_code == 200
    finally:
        stop_server(first)


def test_serve_json_on_port_0_announces_the_bound_port(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "serve", "--port", "0", "--json"], cwd=tmp_path,
        env=clean_env(YOKE_ACCESS_LOG="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "yoke serve --json printed nothing within 60 s"
        announced = json.loads(process.stdout.readline())
        # The fields docs/basics/cli.md lists (token only with --print-token).
        assert set(announced) == {
            "url", "token_file", "database_url", "app", "executor", "console", "dev", "workers", "subscriptions",
        }
        assert (announced["app"], announced["executor"], announced["dev"], announced["workers"]) == (None, True, False, 1)
        assert announced["subscriptions"] == []
        port = int(announced["url"].rsplit(":", 1)[1])
        assert port != 0
        assert announced["token_file"] == f".yoke/token-{port}"
        assert announced["database_url"] == "sqlite:///./.yoke/yoke.db"
        token = (tmp_path / announced["token_file"]).read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(announced["url"] + "/v1/streams", headers=headers).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def test_two_servers_in_one_directory_keep_their_own_tokens(tmp_path):
    """Two databases served from one directory: each server writes
    .yoke/token-<its port>, and the CLI uses the file of the --url's port."""
    a = start_server(f"sqlite:///{tmp_path}/a.db", tmp_path / ".yoke")
    b = start_server(f"sqlite:///{tmp_path}/b.db", tmp_path / ".yoke")
    try:
        assert a.token_file != b.token_file and a.token != b.token
        assert a.token_file.read_text().strip() == a.token  # the second did not overwrite the first
        yoke("append", "/only-a", "x", "--url", a.url, cwd=tmp_path)
        assert "/only-a" in yoke("streams", "--url", a.url, cwd=tmp_path).stdout
        on_b = yoke("read", "/only-a", "--url", b.url, cwd=tmp_path, check=False)
        assert on_b.returncode == 1 and "no stream /only-a in tenant default" in on_b.stderr
        assert yoke("streams", "--url", b.url, cwd=tmp_path).stdout == "(no streams in tenant default)\n"
        # A third server on a's database, from the same directory, reuses a's token.
        c = start_server(f"sqlite:///{tmp_path}/a.db", tmp_path / ".yoke")
        try:
            assert c.token == a.token and c.token_file.read_text().strip() == a.token
            assert "/only-a" in yoke("streams", "--url", c.url, cwd=tmp_path).stdout
        finally:
            stop_server(c)
    finally:
        stop_server(b)
        stop_server(a)


def test_401_says_which_token_was_used_and_how_to_fix_it(tmp_path):
    a = start_server(f"sqlite:///{tmp_path}/a.db", tmp_path / ".yoke")
    b = start_server(f"sqlite:///{tmp_path}/b.db", tmp_path / ".yoke")
    port = a.url.rsplit(":", 1)[1]
    try:
        # a's token file holding b's token (as when an older server wrote it).
        a.token_file.write_text(b.token + "\n")
        done = yoke("read", "/x", "--url", a.url, cwd=tmp_path, check=False)
        assert done.returncode == 1
        assert done.stderr.startswith(f"error: unauthorized (401): {a.url} refused the token in .yoke/token-{port}")
        assert f"restart `yoke serve --port {port}`" in done.stderr and "--token / set YOKE_TOKEN" in done.stderr

        done = yoke("read", "/x", "--url", a.url, cwd=tmp_path, check=False, YOKE_TOKEN="yk_bogus")
        assert done.returncode == 1
        assert f"{a.url} refused the token in $YOKE_TOKEN" in done.stderr
        assert f"unset it to use .yoke/token-{port}" in done.stderr

        done = yoke("read", "/x", "--url", a.url, "--token", "yk_bogus", cwd=tmp_path, check=False)
        assert done.returncode == 1 and f"{a.url} refused the token given with --token" in done.stderr

        # From a directory where no server wrote a token file.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        done = yoke("read", "/x", "--url", a.url, cwd=elsewhere, check=False)
        assert done.returncode == 1
        assert f"no token for {a.url}: .yoke/token-{port} does not exist" in done.stderr
        assert "pass --token or set YOKE_TOKEN" in done.stderr
    finally:
        stop_server(b)
        stop_server(a)


def test_no_server_says_how_to_start_one(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("read", "/x"), ("tail", "/x"), ("streams",), ("instances", "list")):
        done = yoke(*args, "--url", url, cwd=tmp_path, check=False)
        assert done.returncode == 1
        assert done.stderr == (
            f"error: no Yoke server at {url}; start one with `make run` or `yoke serve` (another port: --port N), "
            "or point --url (or YOKE_URL) at a running one\n"
        ), args


def test_serve_help_lists_the_environment_it_reads(tmp_path):
    shown = yoke("serve", "--help", cwd=tmp_path).stdout
    for field in dataclasses.fields(Settings):
        assert f"YOKE_{field.name.upper()}" in shown
    assert "YOKE_APP" in shown
    worker_help = yoke("worker", "--help", cwd=tmp_path).stdout
    assert "YOKE_DATABASE_URL" in worker_help and "YOKE_WORKER_HEARTBEAT_S" in worker_help
    read_help = yoke("read", "--help", cwd=tmp_path).stdout
    assert "YOKE_URL" in read_help and "YOKE_TOKEN" in read_help


def test_token_file_is_private_and_keyed_by_port(tmp_path):
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    try:
        assert server.token_file.name == f"token-{server.url.rsplit(':', 1)[1]}"
        assert server.token_file.stat().st_mode & 0o777 == 0o600
        assert not (tmp_path / ".yoke" / "token").exists()
    finally:
        stop_server(server)



DECLARING_APP = """
import yoke

app = yoke.App(name="shop")
app.subscription("/orders", "mirror", yoke.copy_to_stream("/archive"), filter={"types": ["order.%s"]})
"""


def test_serve_and_worker_report_the_apps_declared_subscriptions(tmp_path):
    """A user's own module in the directory they serve from: the first start
    creates its subscription, the next finds it unchanged (banner and
    --json), a changed filter is reported changed by the worker."""
    (tmp_path / "shop.py").write_text(DECLARING_APP % "placed")

    def serve_json() -> dict:
        process = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", "serve", "--app", "shop:app", "--port", "0", "--json"], cwd=tmp_path,
            env=clean_env(YOKE_ACCESS_LOG="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            ready, _, _ = select.select([process.stdout], [], [], 60)
            assert ready, "yoke serve --json printed nothing within 60 s"
            return json.loads(process.stdout.readline())
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)

    first = serve_json()
    assert [(s["path"], s["name"], s["outcome"]) for s in first["subscriptions"]] == [("/orders", "mirror", "created")]
    assert first["subscriptions"][0]["tenant"] == "default" and first["subscriptions"][0]["offset"] == 1

    # Unbuffered (bufsize=0): a buffered readline could hold the banner's
    # later lines in Python's buffer, where select() does not see them.
    process = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "serve", "--app", "shop:app", "--port", "0"], cwd=tmp_path,
        env=clean_env(YOKE_ACCESS_LOG="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
    )
    try:
        seen = []
        while not any("subscriptions unchanged: mirror (/orders)" in line for line in seen):
            ready, _, _ = select.select([process.stderr], [], [], 60)
            assert ready, f"no banner line about the subscription within 60 s: {seen}"
            line = process.stderr.readline().decode()
            assert line, f"yoke serve ended: {seen}"
            seen.append(line)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)

    (tmp_path / "shop.py").write_text(DECLARING_APP % "paid")
    worker = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "worker", "--app", "shop:app", "--json"], cwd=tmp_path,
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([worker.stdout], [], [], 60)
        assert ready, "yoke worker --json printed nothing within 60 s"
        announced = json.loads(worker.stdout.readline())
        assert [(s["name"], s["outcome"]) for s in announced["subscriptions"]] == [("mirror", "changed")]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
