"""Bearer tokens: 401 without a valid one, 403 for a missing scope or another tenant."""

from __future__ import annotations

import time
import uuid

import orjson

from .conftest import events_url


def code(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_missing_or_bad_token_is_401(server, path):
    with server.client(token="") as anonymous:
        r = anonymous.get(events_url(path))
        assert code(r) == (401, "unauthorized")
        assert r.headers["WWW-Authenticate"] == "Bearer"
    for bad in ("nonsense", server.token[:-2] + "xx", "yk_tok_0000000000000000." + "a" * 43):
        with server.client(token=bad) as c:
            assert code(c.get(events_url(path))) == (401, "unauthorized")
    # Health probes need no token.
    with server.client(token="") as anonymous:
        assert anonymous.get("/healthz").status_code == 200


def test_scopes(server, path):
    tenant = "default"
    reader = server.new_token(tenant, "read")
    appender = server.new_token(tenant, "append")
    with server.client(reader) as r, server.client(appender) as a:
        assert code(r.post(events_url(path), json={"type": "x"})) == (403, "forbidden")
        assert a.post(events_url(path), json={"type": "x"}).status_code == 201
        assert r.get(events_url(path)).status_code == 200
        assert code(a.get(events_url(path))) == (403, "forbidden")
        assert code(a.post(events_url(path, "close"))) == (403, "forbidden")  # admin only
        assert code(r.get("/v1/tokens")) == (403, "forbidden")


def test_another_tenants_stream_is_403_whether_or_not_it_exists(server, http, path):
    other_tenant = "other-" + uuid.uuid4().hex[:8]
    other = server.new_token(other_tenant, "read,append,admin")
    with server.client(other) as c:
        assert c.post(events_url(path), json={"type": "theirs"}).status_code == 201
    # The same path in our tenant is a different (missing) stream ...
    assert http.get(f"/v1/streams{path}").status_code == 404
    # ... and naming their tenant is refused the same way for existing and missing streams.
    for target in (path, path + "-missing"):
        assert code(http.get(events_url(target), params={"tenant": other_tenant})) == (403, "forbidden")
        assert code(http.post(events_url(target), params={"tenant": other_tenant}, json={"type": "x"})) == (
            403, "forbidden",
        )
    with server.client(other) as c:
        assert [e["type"] for e in c.get(events_url(path)).json()["events"]] == ["theirs"]
        assert code(c.post(f"{events_url(path, 'consumers')}/me/ack", params={"tenant": "default"}, json={"offset": 1})) == (
            403, "forbidden",
        )


def test_tokens_api_and_revocation(server, http):
    r = http.post("/v1/tokens", json={"scopes": ["read"], "name": "dashboard"})
    assert r.status_code == 201
    created = r.json()
    assert created["tenant"] == "default" and created["scopes"] == ["read"]
    listed = http.get("/v1/tokens").json()["tokens"]
    assert created["token_id"] in [t["token_id"] for t in listed]
    assert all("secret" not in t and "token" not in t for t in listed)
    with server.client(created["token"]) as c:
        assert c.get("/v1/streams").status_code == 200
        assert http.delete(f"/v1/tokens/{created['token_id']}").status_code == 204
        assert code(c.get("/v1/streams")) == (401, "unauthorized")  # revoked on this server at once
    assert code(http.delete(f"/v1/tokens/{created['token_id']}")) == (404, "token_not_found")
    assert code(http.post("/v1/tokens", json={"scopes": ["root"]})) == (400, "invalid_input")


def test_cli_tokens(server):
    tenant = "cli-" + uuid.uuid4().hex[:6]
    out = server.cli("tokens", "create", "--tenant", tenant, "--scopes", "read,append")
    token = out.stdout.split()[0]
    listed = server.cli("tokens", "list", "--tenant", tenant).stdout
    assert "read,append" in listed and "active" in listed
    token_id = token.split(".")[0][3:]
    assert server.cli("tokens", "revoke", token_id, "--tenant", tenant).returncode == 0
    assert "revoked" in server.cli("tokens", "list", "--tenant", tenant).stdout
    failed = server.cli("tokens", "revoke", token_id, "--tenant", tenant, check=False)
    # the last line: asyncpg may log a pool warning first when the refused revoke releases its connection
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1].startswith("error:")
    # Other processes see a revocation within the token cache's lifetime.
    deadline = time.monotonic() + 10
    with server.client(token) as c:
        while c.get("/v1/streams").status_code != 401:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_an_expiring_token_is_refused_once_expired_even_while_remembered(server, http):
    r = http.post("/v1/tokens", json={"scopes": ["read"], "name": "brief", "expires_in_s": 3})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["expires_at"] == created["created_at"] + 3000
    listed = {t["token_id"]: t for t in http.get("/v1/tokens").json()["tokens"]}
    assert listed[created["token_id"]]["expires_at"] == created["expires_at"]
    with server.client(created["token"]) as c:
        assert c.get("/v1/streams").status_code == 200  # authenticated: the server now remembers it
        deadline = time.monotonic() + 15
        while (answer := c.get("/v1/streams")).status_code == 200:
            assert time.monotonic() < deadline, "the token did not expire"
            time.sleep(0.1)
        assert code(answer) == (401, "token_expired")
        assert answer.json()["error"]["token_id"] == created["token_id"]
    for bad in (0, -1, 1.5, "30d", True):
        assert code(http.post("/v1/tokens", json={"scopes": ["read"], "expires_in_s": bad})) == (400, "invalid_input")


def test_cli_tokens_with_an_expiry(server):
    tenant = "exp-" + uuid.uuid4().hex[:6]
    made = orjson.loads(server.cli("tokens", "create", "--tenant", tenant, "--expires", "30d", "--json").stdout)
    assert made["expires_at"] == made["created_at"] + 30 * 86_400_000
    assert "active, expires" in server.cli("tokens", "list", "--tenant", tenant).stdout
    refused = server.cli("tokens", "create", "--tenant", tenant, "--expires", "0", check=False)
    assert refused.returncode == 2 and "30d" in refused.stderr
