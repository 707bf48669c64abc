"""The console under ``yoke serve --dev`` (authentication off), in a real
headless Chromium: ``/ui`` opens signed in as the dev tenant, without the
printed one-time link, as the API takes requests without a token; its
writes need no cookie and no CSRF token. SQLite only: nothing here depends
on the backend."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.test_console import printed_link
from tests.http.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("dev-console")
    srv = start_server(f"sqlite:///{base}/yoke.db", base / ".yoke", args=("--dev",))
    try:
        yield srv
    finally:
        stop_server(srv)


def open_console(page: Any, server: Server, route: str = "#/", ready: str = "overview") -> None:
    page.goto(f"{server.url}/ui/{route}")
    expect(page.locator(f'body[data-ready="{ready}"]')).to_be_attached()


def test_the_console_opens_signed_in_as_the_dev_tenant(page: Any, dev_server: Server, offline: Any) -> None:
    offline.strict = True
    path = f"/dev-{uuid.uuid4().hex[:8]}"
    appended = httpx.post(f"{dev_server.url}/v1/streams{path}/-/events", json={"type": "note.added", "payload": {}})
    assert appended.status_code == 201  # the API takes it without a token
    assert printed_link(dev_server).endswith("/ui/")  # no one-time code to redeem
    open_console(page, dev_server)
    expect(page.locator("#who")).to_contain_text("default · admin · dev mode")
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)  # nothing to sign out of
    open_console(page, dev_server, f"#/stream?path={path}", "stream")
    expect(page.locator("#main")).to_contain_text("note.added")
    # A write from the console: a token, made without a cookie or a CSRF token.
    open_console(page, dev_server, "#/tokens", "tokens")
    page.locator("#token-name").fill("made in dev mode")
    page.get_by_role("button", name="Create").click()
    secret = page.locator("#token-secret").inner_text().strip()
    with httpx.Client(base_url=dev_server.url, headers={"Authorization": f"Bearer {secret}"}) as client:
        assert client.get("/v1/streams").status_code == 200
    assert page.context.cookies() == []
    page.reload()  # still signed in: the dev session is the server's, not a cookie's
    expect(page.locator('body[data-ready="tokens"]')).to_be_attached()


def test_a_stale_session_cookie_gives_way_to_the_dev_session(page: Any, dev_server: Server) -> None:
    """A cookie from an earlier server on this address holds a token this one
    does not know: sent with every request it would make each a 401, so the
    session answer clears it."""
    page.context.add_cookies([{"name": "yoke_session", "value": "yk_tok_stale.secret", "url": dev_server.url}])
    open_console(page, dev_server)
    expect(page.locator("#who")).to_contain_text("dev mode")
    assert page.context.cookies() == []


def test_a_session_cookie_of_a_real_token_keeps_its_identity(page: Any, dev_server: Server) -> None:
    """Signed in with a token, the console acts as that token, dev mode or not."""
    token = dev_server.new_token("acme", "read")
    assert page.request.post(dev_server.url + "/ui/session", data={"token": token}).ok
    open_console(page, dev_server)
    expect(page.locator("#who")).to_contain_text("acme · read")
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
