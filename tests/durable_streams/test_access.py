"""Access to the protocol routes: Yoke bearer tokens with the /v1 rules on a
normal server (tenant from the token, scopes per method), and ``yoke serve
--dev`` (no token: tenant default, every scope; loopback only; the banner
says so). Both backends."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.http.conftest import Server, own_database, start_server, stop_server


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("ds-access")
    with own_database(request.param, base, "yoke_ds_access") as db_url:
        srv = start_server(db_url, base / ".yoke")
        try:
            yield srv
        finally:
            stop_server(srv)


def test_tokens_decide_tenant_and_scopes(server: Server) -> None:
    name = "acl-" + uuid.uuid4().hex[:8]
    url = f"{server.url}/v1/stream/{name}"
    assert httpx.get(url).status_code == 401  # no token, no --dev
    assert httpx.put(url, headers={"Authorization": "Bearer yk_tok_nope"}).status_code == 401

    reader = {"Authorization": f"Bearer {server.new_token('default', 'read')}"}
    writer = {"Authorization": f"Bearer {server.new_token('default', 'append')}"}
    other = {"Authorization": f"Bearer {server.new_token('acme', 'admin')}"}
    json_type = {"Content-Type": "application/json"}

    assert httpx.put(url, headers={**reader, **json_type}).status_code == 403  # read scope only
    assert httpx.put(url, headers={**writer, **json_type}).status_code == 201
    assert httpx.post(url, headers={**writer, **json_type}, content=b'{"a":1}').status_code == 204
    assert httpx.get(url, headers=reader, params={"offset": "-1"}).json() == [{"a": 1}]
    assert httpx.delete(url, headers=writer).status_code == 403  # DELETE needs admin, as on /v1
    # Another tenant's token sees another tenant: no such stream there, and
    # naming the first tenant is refused.
    assert httpx.get(url, headers=other).status_code == 404
    assert httpx.get(url, headers=other, params={"tenant": "default"}).status_code == 403
    # The stream is Yoke stream /name of tenant default.
    with server.client() as client:
        events = client.get(f"/v1/streams/{name}/-/events", params={"after": 0}).json()["events"]
    assert [(e["type"], e["payload"]) for e in events] == [("ds.message", {"a": 1})]


def test_dev_mode_serves_without_a_token_and_says_so(dev_server: Server) -> None:
    url = f"{dev_server.url}/v1/stream/dev-{uuid.uuid4().hex[:8]}"
    assert httpx.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
    assert httpx.post(url, headers={"Content-Type": "text/plain"}, content=b"hi").status_code == 204
    assert httpx.get(url).text == "hi"
    assert httpx.delete(url).status_code == 204  # every scope
    # Yoke's own API too, as tenant default.
    assert httpx.get(f"{dev_server.url}/v1/streams").status_code == 200
    assert httpx.get(f"{dev_server.url}/v1/streams", params={"tenant": "acme"}).status_code == 403
    port = dev_server.url.rsplit(":", 1)[1]
    banner = (dev_server.data_dir.parent / f"server-{port}.log").read_text()
    assert "authentication is OFF (--dev)" in banner


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_dev_mode_refuses_other_addresses(host: str, tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "yoke.cli", "serve", "--dev", "--host", host, "--port", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "YOKE_DATABASE_URL": f"sqlite:///{tmp_path}/yoke.db"},
    )
    assert run.returncode != 0
    assert "loopback" in run.stderr and host in run.stderr
    assert not (tmp_path / "yoke.db").exists()  # refused before anything opened
