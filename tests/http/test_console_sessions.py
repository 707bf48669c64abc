"""The console's sessions against a real ``yoke serve`` per backend: the page
and its Content-Security-Policy, the printed one-time link, a pasted token,
the cookie and its CSRF check on every write, signing out."""

from __future__ import annotations

import re

import httpx

from .conftest import Server
from .test_console_api import error_of


# --- console sessions --------------------------------------------------------------------


def printed_link(server: Server) -> str:
    log = server.data_dir.parent / f"server-{server.url.rsplit(':', 1)[1]}.log"
    return re.search(r"console:\s+(\S+)", log.read_text()).group(1)


def test_console_page_and_its_policy(console_server):
    page = httpx.get(console_server.url + "/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    assert httpx.get(console_server.url + "/ui").status_code == 307
    script = httpx.get(console_server.url + "/ui/assets/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]


def test_sessions_from_the_printed_link_and_from_a_token(console_server):
    base = console_server.url
    link = printed_link(console_server)
    assert link.startswith(base + "/ui/#code=")
    code = link.split("#code=", 1)[1]
    with httpx.Client(base_url=base) as browser:
        assert browser.get("/ui/session").json() == {"signed_in": False}
        # While the code is unused, any other string is just wrong, a lone
        # surrogate too (it was a 500).
        lone = browser.post("/ui/session", content=b'{"code": "\\ud800"}', headers={"Content-Type": "application/json"})
        assert error_of(lone) == (401, "unauthorized")
        signed = browser.post("/ui/session", json={"code": code})
        assert signed.status_code == 200, signed.text
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        session = signed.json()
        assert (session["signed_in"], session["tenant"], session["scopes"], session["name"]) == (
            True, "default", ["admin"], "console sign-in"
        )
        assert browser.get("/ui/session").json() == session
        assert browser.get("/v1/streams").status_code == 200  # the cookie stands in for the header
        # A write with the cookie needs the CSRF token, on every route (the append hot path too).
        event = {"type": "console.test"}
        assert error_of(browser.post("/v1/streams/console/-/events", json=event)) == (403, "forbidden")
        wrong = browser.post("/v1/streams/console/-/events", json=event, headers={"X-Yoke-CSRF": "0" * 32})
        assert error_of(wrong) == (403, "forbidden") and wrong.json()["error"]["reason"] == "csrf"
        assert error_of(browser.post("/v1/streams/console/-/close")) == (403, "forbidden")
        csrf = {"X-Yoke-CSRF": session["csrf"]}
        assert browser.post("/v1/streams/console/-/events", json=event, headers=csrf).status_code == 201
        assert browser.post("/v1/tokens", json={"scopes": ["read"]}, headers=csrf).status_code == 201
        # The code was for one sign-in.
        with httpx.Client(base_url=base) as again:
            assert error_of(again.post("/ui/session", json={"code": code})) == (401, "unauthorized")
        # Signing out revokes the link's token and clears the cookie.
        assert error_of(browser.delete("/ui/session")) == (403, "forbidden")  # a write: CSRF too
        assert browser.delete("/ui/session", headers=csrf).status_code == 204
        assert error_of(browser.get("/v1/streams")) == (401, "unauthorized")
        assert browser.get("/ui/session").json() == {"signed_in": False}
        tokens = httpx.get(base + "/v1/tokens", headers={"Authorization": f"Bearer {console_server.token}"}).json()
        assert [t["revoked"] for t in tokens["tokens"] if t["token_id"] == session["token_id"]] == [True]

    reader_token = console_server.new_token("default", "read")
    with httpx.Client(base_url=base) as browser:
        assert error_of(browser.post("/ui/session", json={"token": "yk_tok_nothing"})) == (401, "unauthorized")
        signed = browser.post("/ui/session", json={"token": reader_token}).json()
        assert signed["scopes"] == ["read"]
        csrf = {"X-Yoke-CSRF": signed["csrf"]}
        assert browser.get("/v1/streams/console/-/events").status_code == 200
        refused = browser.post("/v1/streams/console/-/events", json={"type": "x"}, headers=csrf)
        assert error_of(refused) == (403, "forbidden")  # the token's scope, whatever the console shows
        assert browser.delete("/ui/session", headers=csrf).status_code == 204
        assert error_of(browser.get("/v1/streams")) == (401, "unauthorized")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {reader_token}"}) as api:
        assert api.get("/v1/streams").status_code == 200  # a pasted token is not revoked by signing out
    for body in ({}, {"code": "a", "token": "b"}, {"code": 1}, {"token": ""}, {"other": 1}):
        assert error_of(httpx.post(base + "/ui/session", json=body))[0] in (400, 401), body
