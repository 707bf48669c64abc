"""Safe defaults of a real ``yoke serve`` (docs/production/security.md): the
admin token stays in its 0600 file unless --print-token, the console's
sign-in link is printed on a terminal only, one admin token per data
directory (reused, rotated, never two at once), proxy headers from trusted
proxies only (Secure cookies, client addresses), HTTPS, a warning for an
exposed address, /metrics closed off loopback, CORS on both surfaces."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import Server, free_port, own_database, start_server, stop_server

NAME = "yoke serve admin ("


def log_of(server: Server) -> str:
    return (server.data_dir.parent / f"server-{server.url.rsplit(':', 1)[1]}.log").read_text()


def admin_tokens(server: Server) -> list[dict]:
    import orjson

    listed = orjson.loads(server.cli("tokens", "list", "--json").stdout)
    return [t for t in listed if t["name"].startswith(NAME) and not t["revoked"]]


def status(url: str, token: str) -> int:
    return httpx.get(url + "/v1/streams", headers={"Authorization": f"Bearer {token}"}).status_code


# --- the admin token and the sign-in link ------------------------------------------------


def test_secrets_stay_off_a_log_unless_asked(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    try:
        printed = log_of(server)
        assert server.token not in printed and "#code=" not in printed
        assert f"admin token:  in {server.token_file}   (mode 0600; --print-token" in printed
        assert stat.S_IMODE(server.token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
        assert status(server.url, server.token) == 200
    finally:
        stop_server(server)
    asked = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", args=("--print-token",))
    try:
        printed = log_of(asked)
        assert asked.token == server.token  # the directory's token, reused
        assert f"admin token:  {asked.token}" in printed and re.search(r"console:\s+http://\S+/ui/#code=", printed)
    finally:
        stop_server(asked)


def test_the_sign_in_link_is_printed_on_a_terminal(tmp_path: Path) -> None:
    port = free_port()
    terminal, other_end = pty.openpty()
    env = {**os.environ, "YOKE_DATABASE_URL": f"sqlite:///{tmp_path}/yoke.db", "YOKE_PORT": str(port),
           "YOKE_DATA_DIR": str(tmp_path / ".yoke")}
    process = subprocess.Popen([sys.executable, "-m", "yoke.cli", "serve"], env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=other_end)
    os.close(other_end)
    shown = b""
    try:
        deadline = time.monotonic() + 60
        while b"Try it" not in shown:
            assert time.monotonic() < deadline and process.poll() is None, shown.decode(errors="replace")
            if select.select([terminal], [], [], 1)[0]:
                shown += os.read(terminal, 65536)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        os.close(terminal)
    text = shown.decode()
    assert re.search(rf"console:\s+http://127\.0\.0\.1:{port}/ui/#code=\S+\s+\(signs a browser in, once\)", text)
    token = (tmp_path / ".yoke" / f"token-{port}").read_text().strip()
    assert token not in text  # the token itself only with --print-token


def test_one_admin_token_per_data_directory(tmp_path: Path) -> None:
    db, data = f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke"
    first = start_server(db, data)
    try:
        assert [t["token_id"] for t in admin_tokens(first)] == [first.token.split(".")[0][3:]]
        # A second server in the directory shares it; so does a restart on another port.
        second = start_server(db, data)
        assert second.token == first.token
    finally:
        stop_server(first)
    try:
        # Rotated: a new one, the old one revoked, every file that held it rewritten.
        rotated = start_server(db, data, args=("--rotate-token",))
        try:
            assert rotated.token != first.token
            assert second.token_file.read_text().strip() == rotated.token
            deadline = time.monotonic() + 10  # another server forgets a revoked token within 2 s
            while status(second.url, first.token) != 401:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert status(second.url, rotated.token) == 200
            assert [t["token_id"] for t in admin_tokens(rotated)] == [rotated.token.split(".")[0][3:]]
        finally:
            stop_server(rotated)
    finally:
        stop_server(second)
    # The directory's files lost (wiped, or a fresh container on the same host
    # and path): a new token, and the lost one revoked rather than left behind.
    for f in data.glob("token-*"):
        f.unlink()
    again = start_server(db, data)
    try:
        assert again.token != rotated.token and status(again.url, rotated.token) == 401
        assert [t["token_id"] for t in admin_tokens(again)] == [again.token.split(".")[0][3:]]
    finally:
        stop_server(again)


def test_servers_starting_together_in_a_fresh_directory_mint_one_token(tmp_path: Path) -> None:
    with own_database("postgres", tmp_path, "yoke_token_race") as db_url:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:
            servers = list(pool.map(lambda _: start_server(db_url, tmp_path / ".yoke"), range(3)))
        try:
            assert len({s.token for s in servers}) == 1
            assert len(admin_tokens(servers[0])) == 1
        finally:
            for s in servers:
                stop_server(s)


# --- behind a proxy, HTTPS, exposed addresses ----------------------------------------------------


def sign_in(url: str, token: str, **headers: str) -> str:
    answer = httpx.post(url + "/ui/session", json={"token": token}, headers=headers, verify=False)
    assert answer.status_code == 200, answer.text
    return answer.headers["set-cookie"]


def test_proxy_headers_from_trusted_proxies_only(tmp_path: Path) -> None:
    db, data = f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke"
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    plain = start_server(db, data, YOKE_ACCESS_LOG="1")
    try:
        assert "Secure" not in sign_in(plain.url, plain.token, **forwarded)  # no proxy trusted: ignored
        assert "203.0.113.7" not in log_of(plain)
        assert httpx.get(plain.url + "/metrics").status_code == 200  # loopback, no proxy: open
    finally:
        stop_server(plain)
    behind = start_server(db, data, args=("--proxy-headers",), YOKE_ACCESS_LOG="1")
    try:
        assert "Secure" in sign_in(behind.url, behind.token, **forwarded)
        assert "Secure" not in sign_in(behind.url, behind.token)  # plain HTTP through the proxy
        assert re.search(r"uvicorn\.access \[req \w+\]: 203\.0\.113\.7:\d+ - ", log_of(behind))
        # Behind a proxy, /metrics is reachable from afar: closed without a token.
        closed = httpx.get(behind.url + "/metrics")
        assert closed.status_code == 401 and "YOKE_METRICS_TOKEN" in closed.json()["error"]["message"]
        assert "/metrics is closed" in log_of(behind)
    finally:
        stop_server(behind)
    untrusted = start_server(db, data, args=("--proxy-headers", "--forwarded-allow-ips", "10.1.2.3"))
    try:
        assert "Secure" not in sign_in(untrusted.url, untrusted.token, **forwarded)
    finally:
        stop_server(untrusted)


def test_an_exposed_address_warns_and_closes_metrics(tmp_path: Path) -> None:
    db, data = f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke"
    exposed = start_server(db, data, args=("--host", "0.0.0.0"))
    try:
        printed = log_of(exposed)
        assert re.search(r"WARNING yoke\.cli: listening on 0\.0\.0\.0 without TLS", printed)
        assert re.search(r"WARNING yoke\.cli: /metrics is closed: this process listens on 0\.0\.0\.0", printed)
        assert httpx.get(exposed.url + "/metrics").status_code == 401
    finally:
        stop_server(exposed)
    tokened = start_server(db, data, args=("--host", "0.0.0.0"), YOKE_METRICS_TOKEN="m-secret")
    try:
        assert httpx.get(tokened.url + "/metrics").status_code == 401
        assert httpx.get(tokened.url + "/metrics", headers={"Authorization": "Bearer m-secret"}).status_code == 200
        assert "/metrics is closed" not in log_of(tokened)
    finally:
        stop_server(tokened)
    public = start_server(db, data, args=("--host", "0.0.0.0"), YOKE_METRICS_PUBLIC="1")
    try:
        assert httpx.get(public.url + "/metrics").status_code == 200
    finally:
        stop_server(public)


def test_https_with_a_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True,
    )
    port = free_port()
    env = {**os.environ, "YOKE_DATABASE_URL": f"sqlite:///{tmp_path}/yoke.db", "YOKE_PORT": str(port),
           "YOKE_DATA_DIR": str(tmp_path / ".yoke"), "YOKE_TLS_CERT": str(cert), "YOKE_TLS_KEY": str(key)}
    log = tmp_path / "server.log"
    process = subprocess.Popen([sys.executable, "-m", "yoke.cli", "serve"], env=env, cwd=tmp_path,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", verify=False, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.05)
        token = (tmp_path / ".yoke" / f"token-{port}").read_text().strip()
        assert "Secure" in sign_in(url, token)
        assert f"URL:          {url}" in log.read_text()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)  # no plain HTTP on it
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    missing_key = subprocess.run([sys.executable, "-m", "yoke.cli", "serve", "--tls-cert", str(cert)],
                                 env={**env, "YOKE_TLS_KEY": ""}, cwd=tmp_path, capture_output=True, text=True)
    assert missing_key.returncode == 1 and "both --tls-cert and --tls-key" in missing_key.stderr


# --- CORS -------------------------------------------------------------------------------


def cors(answer: httpx.Response) -> str | None:
    return answer.headers.get("access-control-allow-origin")


def test_cors_by_default_keeps_each_surface_as_it_was(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke")
    try:
        origin = {"Origin": "https://app.example"}
        with server.client() as http:
            assert http.put("/v1/stream/c", headers={**origin, "Content-Type": "text/plain"}).status_code == 201
            assert cors(http.get("/v1/stream/c", headers=origin)) == "*"  # the protocol's clients
            assert cors(http.get("/v1/streams", headers=origin)) is None
    finally:
        stop_server(server)


def test_cors_origins_decide_on_both_surfaces(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke",
                          args=("--cors-origins", "https://app.example, http://localhost:3000"))
    try:
        allowed, other = {"Origin": "https://app.example"}, {"Origin": "https://evil.example"}
        with server.client() as http:
            assert http.put("/v1/stream/c", headers={**allowed, "Content-Type": "text/plain"}).status_code == 201
            for url in ("/v1/streams", "/v1/stream/c"):
                answer = http.get(url, headers=allowed)
                assert answer.status_code == 200 and cors(answer) == "https://app.example", url
                assert "Origin" in answer.headers["vary"] and "X-Request-ID" in answer.headers["access-control-expose-headers"]
                assert cors(http.get(url, headers=other)) is None, url
                assert cors(http.get(url)) is None, url
            # A browser's preflight, answered for an allowed origin only.
            ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
            preflight = httpx.options(server.url + "/v1/streams/a/-/events", headers={**allowed, **ask})
            assert preflight.status_code == 204 and cors(preflight) == "https://app.example"
            assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
            assert "POST" in preflight.headers["access-control-allow-methods"]
            refused = httpx.options(server.url + "/v1/stream/c", headers={**other, **ask})
            assert refused.status_code == 204 and cors(refused) is None
    finally:
        stop_server(server)
    bad = subprocess.run([sys.executable, "-m", "yoke.cli", "serve", "--cors-origins", "app.example"],
                         env={**os.environ, "YOKE_DATA_DIR": str(tmp_path / ".yoke")}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "app.example is not an origin" in bad.stderr


def test_cors_any_origin(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", args=("--cors-origins", "*"))
    try:
        with server.client() as http:
            assert cors(http.get("/v1/streams", headers={"Origin": "https://anyone.example"})) == "*"
    finally:
        stop_server(server)
