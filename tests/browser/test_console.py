"""The web console (/ui) in a real headless Chromium, against a real
``yoke serve --app tests.http.console_app:app`` on SQLite and on PostgreSQL.

Each test is a person's task: sign in from the printed link, see a stream
appended through the API, watch a live tail, redrive a dead letter, resume a
halted subscription, create and revoke a token, read with a read-only token,
page through 100,000 events, use it on a phone, by keyboard, in the dark.
Payloads, types, paths and names that look like markup stay text. Every
request beyond 127.0.0.1, script error, policy refusal and browser console
error fails the test (conftest ``page``; ``offline.strict``), except the
error responses a test provokes on purpose.

Every page is saved as a screenshot per run under ``artifacts/console/``
(ignored by git); with ``YOKE_DOC_SCREENSHOTS=1`` the SQLite run also
refreshes the ones the docs show (``docs/basics/console/``).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.http.conftest import Server
from tests.http.test_subscriptions_api import Hook

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "console"
DOC_SHOTS = ROOT / "docs" / "basics" / "console"
# The screenshots docs/basics/console.md and the README show.
DOC_PAGES = {"overview", "stream-events", "instance-dead-letters", "subscription", "stream-phone", "overview-dark"}
DEADLINE_S = 30


class Console:
    """A page of the console signed in (or not) on ``server``."""

    def __init__(self, page: Any, server: Server, offline: Any) -> None:
        self.page = page
        self.server = server
        self.url = server.url
        self.backend = "sqlite" if server.db_url.startswith("sqlite") else "postgres"
        self.api = server.client()
        offline.strict = True
        self.offline = offline

    def sign_in(self, token: str | None = None) -> None:
        """A session for ``token`` (default: the admin token), as the sign-in form makes one."""
        answer = self.page.request.post(self.url + "/ui/session", data={"token": token or self.server.token})
        assert answer.ok, answer.text()

    def sign_in_to_a_new_tenant(self) -> str:
        """An admin session (and ``api``) in a tenant of its own: its own singleton actors."""
        tenant = "t" + uuid.uuid4().hex[:10]
        token = self.server.new_token(tenant, "admin")
        self.api = self.server.client(token)
        self.sign_in(token)
        return tenant

    def open(self, route: str = "#/", ready: str | None = None) -> None:
        self.page.goto(f"{self.url}/ui/{route}")
        self.wait(ready or page_of(route))

    def wait(self, ready: str) -> None:
        expect(self.page.locator(f'body[data-ready="{ready}"]')).to_be_attached()

    def go(self, route: str, ready: str | None = None) -> None:
        """Navigate within the page (no reload), as a link does."""
        self.page.evaluate("(route) => { location.hash = route; }", route)
        self.wait(ready or page_of(route))

    def shot(self, name: str) -> None:
        folder = ARTIFACTS / self.backend
        folder.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
        if os.environ.get("YOKE_DOC_SCREENSHOTS") == "1" and self.backend == "sqlite" and name in DOC_PAGES:
            DOC_SHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(DOC_SHOTS / f"{name}.png"))

    def append(self, path: str, *events: dict[str, Any]) -> list[int]:
        response = self.api.post(f"/v1/streams{path}/-/events", json=list(events))
        assert response.status_code == 201, response.text
        return [r["offset"] for r in response.json()["results"]]

    def confirm(self) -> None:
        dialog = self.page.locator("#confirm")
        expect(dialog).to_be_visible()
        dialog.locator("#confirm-ok").click()
        expect(dialog).to_be_hidden()


def page_of(route: str) -> str:
    name = route.lstrip("#/").split("?")[0]
    return name or "overview"


def unique(prefix: str) -> str:
    return f"/{prefix}-{uuid.uuid4().hex[:8]}"


def poll(check: Any, what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


@pytest.fixture
def console(page: Any, console_server: Server, offline: Any) -> Console:
    return Console(page, console_server, offline)


# --- signing in --------------------------------------------------------------------------


def printed_link(server: Server) -> str:
    log = server.data_dir.parent / f"server-{server.url.rsplit(':', 1)[1]}.log"
    return re.search(r"console:\s+(\S+)", log.read_text()).group(1)


def test_sign_in_from_the_printed_link_then_sign_out(console: Console) -> None:
    page = console.page
    console.open("#/", "sign-in")
    expect(page.locator("#sign-in")).to_be_visible()
    console.shot("sign-in")
    page.goto(printed_link(console.server))
    console.wait("overview")
    expect(page.locator("[data-figure=rate]")).to_be_visible()
    assert "#code=" not in page.url  # the code left the address bar
    expect(page.locator("#who")).to_contain_text("default · admin")
    # The session survives a reload (the HttpOnly cookie); the script cannot read it.
    page.reload()
    console.wait("overview")
    assert page.evaluate("document.cookie") == ""
    page.get_by_role("button", name="Sign out").click()
    console.wait("sign-in")
    page.reload()
    console.wait("sign-in")
    # The link was for one sign-in.
    console.offline.errors_expected.add("401")
    page.goto(printed_link(console.server))
    console.wait("sign-in")
    expect(page.locator("#sign-in .note")).to_contain_text("did not work")
    # A pasted token signs in.
    page.locator("#token").fill(console.server.token)
    page.locator("#token").press("Enter")
    console.wait("overview")


# --- every page, a stream appended through the API ---------------------------------------


def test_every_page_and_a_stream_appended_through_the_api(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("orders")
    console.append(path, {"type": "ledger.credit", "payload": {"amount": 5}},
                   {"type": "ledger.debit", "payload": {"amount": -2}}, {"type": "flaky.fail", "payload": {"n": 1}})
    console.open("#/streams?prefix=" + path)  # how fast: bench/console.py
    row = page.locator("#streams tbody tr").filter(has_text=path)
    expect(row).to_be_visible()
    console.shot("streams")
    row.get_by_role("link", name=path).click()
    console.wait("stream")
    expect(page.locator("#events tbody tr")).to_have_count(3)
    expect(page.locator("#head")).to_have_text("3")
    console.shot("stream-events")
    page.locator("#events tbody tr").first.get_by_role("link").click()
    console.wait("event")
    expect(page.locator("pre.json")).to_contain_text('"ledger.credit"')
    expect(page.get_by_role("button", name="Copy JSON")).to_be_visible()
    console.shot("event")
    for tab in ("tail", "append", "subscriptions", "settings"):
        console.go(f"#/stream?path={path}&tab={tab}", "stream")
        console.shot(f"stream-{tab}")

    # The overview: every figure links to its page.
    console.go("#/")
    expect(page.locator("[data-figure=dead] .figure-value")).not_to_have_text("0", timeout=DEADLINE_S * 1000)
    console.shot("overview")
    page.locator("[data-figure=dead]").click()
    console.wait("actors")
    expect(page.locator("#dead-instances")).to_be_visible()
    console.go("#/actors")
    expect(page.locator("#actor-types")).to_contain_text("ledger")
    console.shot("actors")
    page.locator("#instances tbody tr").filter(has_text="ledger").get_by_role("link").first.click()
    console.wait("instance")
    ledger = re.search(r"id=([^&]+)", page.url).group(1)
    expect(page.locator("pre.json").first).to_contain_text('"entries"')
    console.shot("instance-state")
    for tab in ("queue", "dead", "schedules"):
        console.go(f"#/instance?id={ledger}&tab={tab}", "instance")
        console.shot(f"instance-{tab}")
    expect(page.locator("#schedules")).to_contain_text("daily-total")
    console.go(f"#/instance?id={ledger}&tab=sql", "instance")
    page.locator("#sql").fill("SELECT type, amount FROM entries ORDER BY offset")
    page.locator("#sql").press("Control+Enter")
    expect(page.locator("#sql-result")).to_contain_text("ledger.debit")
    console.shot("instance-sql")
    console.offline.errors_expected.add("400")
    page.locator("#sql").fill("DELETE FROM entries")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("#sql-form .error")).to_contain_text("invalid_input")
    for route in ("#/subscriptions", "#/tokens"):
        console.go(route)
        console.shot(page_of(route))


# --- the live tail -------------------------------------------------------------------------


def test_live_tail_shows_a_new_event_within_a_second_pauses_and_filters(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("tail")
    console.append(path, {"type": "start"})
    console.open(f"#/stream?path={path}&tab=tail", "stream")
    expect(page.locator("#tail-state")).to_have_text("live")
    # When each row appears, by the page's clock.
    page.evaluate("""() => {
        window.seen = {};
        new MutationObserver(() => {
            for (const row of document.querySelectorAll('#tail tbody tr')) {
                window.seen[row.dataset.offset] ??= Date.now();
            }
        }).observe(document.querySelector('#tail tbody'), { childList: true });
    }""")
    before = page.evaluate("Date.now()")
    [offset] = console.append(path, {"type": "order.placed", "payload": {"total": 7}})
    row = page.locator(f'#tail tbody tr[data-offset="{offset}"]')
    expect(row).to_be_visible()
    latency_ms = page.evaluate(f"window.seen[{offset}]") - before
    assert latency_ms < 1000, f"the tail showed the event after {latency_ms} ms"
    console.shot("stream-tail-live")

    page.locator("#tail-pause").click()
    expect(page.locator("#tail-state")).to_have_text("paused")
    [paused] = console.append(path, {"type": "order.placed", "payload": {"total": 8}})
    page.locator("#tail-pause").click()  # resume: from where it stopped, nothing missed
    expect(page.locator(f'#tail tbody tr[data-offset="{paused}"]')).to_be_visible()

    page.locator("#tail-types").fill("order.*")
    page.locator("#tail-where").fill("payload.total > 100")
    page.get_by_role("button", name="Apply filter").click()
    expect(page.locator("#tail-state")).to_have_text("live")
    console.append(path, {"type": "order.placed", "payload": {"total": 5}}, {"type": "other", "payload": {"total": 500}})
    [big] = console.append(path, {"type": "order.placed", "payload": {"total": 500}})
    expect(page.locator(f'#tail tbody tr[data-offset="{big}"]')).to_be_visible()
    expect(page.locator("#tail tbody tr")).to_have_count(1)

    console.offline.errors_expected.add("400")
    page.locator("#tail-where").fill("payload.total >")
    page.get_by_role("button", name="Apply filter").click()
    expect(page.locator(".tab-body .error")).to_contain_text("invalid_filter")


# --- dead letters, subscriptions, tokens ------------------------------------------------------


def test_a_dead_letter_is_redriven_and_processed(console: Console) -> None:
    page = console.page
    console.sign_in_to_a_new_tenant()
    path = unique("jobs")
    [offset] = console.append(path, {"type": "flaky.fail", "payload": {"job": path}})
    flaky = poll(lambda: console.api.get("/v1/instances", params={"actor": "flaky"}).json()["instances"], "flaky")
    instance_id = flaky[0]["id"]

    def dead_rows() -> list[dict[str, Any]]:
        return console.api.get(f"/v1/instances/{instance_id}/dlq").json()["rows"]

    row = poll(lambda: [r for r in dead_rows() if r["path"] == path], "the dead row")[0]
    console.append(path, {"type": "flaky.heal"})
    poll(lambda: (console.api.get(f"/v1/instances/{instance_id}").json()["state"]["value"] or {}).get("healed"), "healed")
    console.open(f"#/instance?id={instance_id}&tab=dead", "instance")
    line = page.locator(f'tr[data-qid="{row["qid"]}"]')
    expect(line).to_contain_text("flaky refuses")
    console.shot("instance-dead-letters")
    line.locator("input.pick").check()
    page.locator("#redrive-selected").click()
    console.confirm()
    expect(page.locator(".tab-body .ok")).to_have_text("Redriven: 1.")
    expect(page.locator(f'tr[data-qid="{row["qid"]}"]')).to_have_count(0)
    state = poll(lambda: (console.api.get(f"/v1/instances/{instance_id}").json()["state"]["value"] or {}).get("done"),
                 "the redriven row processed")
    assert state >= 1 and not [r for r in dead_rows() if r["path"] == path]
    assert offset >= 1


def test_a_halted_subscription_is_resumed(console: Console) -> None:
    page = console.page
    hook = Hook()
    try:
        console.sign_in()
        path = unique("events")
        made = console.api.post(f"/v1/streams{path}/-/subscriptions", json={
            "name": "to-hook", "receiver": {"kind": "webhook", "url": hook.url}, "start": "beginning",
        })
        assert made.status_code == 201, made.text
        [offset] = console.append(path, {"type": "ping"})
        status_url = f"/v1/streams{path}/-/subscription"
        poll(lambda: console.api.get(status_url, params={"name": "to-hook"}).json()["halted"], "the halt")
        console.open("#/subscriptions")
        attention = page.locator("#attention tbody tr").filter(has_text=path)
        expect(attention).to_contain_text("halted")
        console.shot("subscriptions-halted")
        attention.get_by_role("link", name="to-hook").click()
        console.wait("subscription")
        expect(page.locator("#sub-state")).to_have_text("halted")
        expect(page.locator("#history")).to_contain_text("halted")
        console.shot("subscription")
        hook.status = 204
        page.locator("[data-action=resume]").click()
        console.confirm()
        console.wait("subscription")
        expect(page.locator("#history")).to_contain_text("resumed")
        status = poll(lambda: (s := console.api.get(status_url, params={"name": "to-hook"}).json())
                      ["processed_through_offset"] >= offset and s, "the delivery")
        assert status["halted"] is None
        console.go(f"#/subscriptions?path={path}")
        expect(page.locator('#subscriptions tr[data-name="to-hook"]')).not_to_contain_text("halted")
    finally:
        hook.close()


def test_a_token_is_created_and_revoked(console: Console) -> None:
    page = console.page
    console.sign_in()
    console.open("#/tokens")
    name = f"billing {uuid.uuid4().hex[:6]}"
    page.locator("#token-name").fill(name)
    page.locator("#create-token input[value=append]").check()
    page.get_by_role("button", name="Create").click()
    secret = page.locator("#token-secret").inner_text().strip()
    assert secret.startswith("yk_tok_")
    console.shot("tokens-created")
    with console.server.client(secret) as client:
        assert client.get("/v1/streams").status_code == 200
        row = page.locator("#tokens tbody tr").filter(has_text=name)
        expect(row).to_contain_text("read, append")
        row.locator("[data-action=revoke]").click()
        console.confirm()
        expect(page.locator("#tokens tbody tr").filter(has_text=name)).to_have_count(0)
        assert poll(lambda: client.get("/v1/streams").status_code == 401, "the revocation")


# --- safety ------------------------------------------------------------------------------


XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def test_markup_and_javascript_urls_stay_text(console: Console, page: Any) -> None:
    console.sign_in_to_a_new_tenant()
    path = unique("javascript:alert")  # a stream path may hold ':'
    console.append(path, {"type": "javascript:alert", "payload": {"html": XSS, "href": "javascript:alert(1)"}},
                   {"type": "flaky.fail", "payload": XSS})
    sub = console.api.post(f"/v1/streams{path}/-/subscriptions",
                           json={"name": XSS, "receiver": {"kind": "copy", "target": path + "/copy"}})
    assert sub.status_code == 201, sub.text
    assert console.api.post("/v1/tokens", json={"name": XSS, "scopes": ["read"]}).status_code == 201
    flaky = poll(lambda: console.api.get("/v1/instances", params={"actor": "flaky"}).json()["instances"], "flaky")
    poll(lambda: [r for r in console.api.get(f"/v1/instances/{flaky[0]['id']}/dlq").json()["rows"]
                  if r["path"] == path], "the dead row with markup in its error")
    instance = flaky[0]["id"]
    pages = [  # each shows the markup as text
        (f"#/streams?prefix={path}", path), (f"#/stream?path={path}", "window.__xss"),
        (f"#/event?path={path}&offset=1", "window.__xss"), (f"#/stream?path={path}&tab=subscriptions", "window.__xss"),
        (f"#/subscription?path={path}&name={XSS}", "window.__xss"), (f"#/instance?id={instance}&tab=dead", "window.__xss"),
        ("#/tokens", "window.__xss"),
    ]
    for route, text in pages:
        console.open(route)
        expect(page.locator("main")).to_contain_text(text)
        assert page.evaluate("window.__xss") is None, route
        assert page.locator("main img, main script").count() == 0, route
        hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.getAttribute('href'))")
        assert all(h.startswith("#") for h in hrefs), hrefs
    console.shot("markup-as-text")
    # The type and the path are text too, and their links stay inside the console.
    console.open(f"#/stream?path={path}")
    expect(page.locator("#events")).to_contain_text("javascript:alert")
    page.locator("#events tbody tr").first.get_by_role("link").click()
    console.wait("event")
    assert page.url.startswith(console.url + "/ui/#/event")


def test_a_read_scope_session_sees_no_write_buttons_and_cannot_write(console: Console) -> None:
    page = console.page
    path = unique("readonly")
    console.append(path, {"type": "ledger.credit", "payload": {"amount": 1}}, {"type": "flaky.fail"})
    reader = console.server.new_token("default", "read")
    console.open("#/", "sign-in")
    page.locator("#token").fill(reader)
    page.get_by_role("button", name="Sign in").click()
    console.wait("overview")
    expect(page.locator("#who")).to_contain_text("default · read")
    console.go(f"#/stream?path={path}&tab=settings", "stream")
    expect(page.locator("#close-stream, #legal-hold, #retention")).to_have_count(0)
    console.go(f"#/stream?path={path}&tab=append", "stream")
    expect(page.locator("#append")).to_have_count(0)
    flaky = console.api.get("/v1/instances", params={"actor": "flaky"}).json()["instances"]
    console.go(f"#/instance?id={flaky[0]['id']}&tab=dead", "instance")
    expect(page.locator("#dead-actions, input.pick")).to_have_count(0)
    console.go("#/tokens")
    expect(page.locator("#create-token")).to_have_count(0)
    console.shot("read-only")
    # The API refuses its writes anyway, CSRF token and all.
    console.offline.errors_expected.add("403")
    refused = page.evaluate("""async (path) => {
        const session = await (await fetch('/ui/session')).json();
        const answer = await fetch('/v1/streams' + path + '/-/close', {
            method: 'POST', headers: { 'X-Yoke-CSRF': session.csrf },
        });
        return [answer.status, (await answer.json()).error.code];
    }""", path)
    assert refused == [403, "forbidden"]
    assert console.api.get(f"/v1/streams{path}").json()["closed"] is False


def test_stream_actions_with_confirmation_and_errors_in_place(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("settings")
    console.append(path, {"type": "a"})
    console.open(f"#/stream?path={path}&tab=append", "stream")
    page.locator("#append-type").fill("typed.here")
    page.locator("#append-payload").fill('{"n": 1}')
    page.get_by_role("button", name="Append").click()
    expect(page.locator("#append .ok")).to_contain_text("offset 2")
    console.offline.errors_expected.add("400")
    page.locator("#append-type").fill("not a type!")
    page.get_by_role("button", name="Append").click()
    expect(page.locator("#append .error")).to_contain_text("invalid_event")
    page.locator("#append-payload").fill("{oops")
    page.get_by_role("button", name="Append").click()
    expect(page.locator("#append .error")).to_contain_text("invalid_json")

    console.go(f"#/stream?path={path}&tab=settings", "stream")
    page.locator("#retention-events").fill("100")
    page.get_by_role("button", name="Set retention").click()
    page.locator("#confirm").get_by_role("button", name="Cancel").click()  # cancelled: nothing changes
    assert console.api.get(f"/v1/streams{path}").json()["retention"]["max_events"] is None
    page.get_by_role("button", name="Set retention").click()
    console.confirm()
    console.wait("stream")
    expect(page.locator(".facts-line")).to_contain_text("100 events")
    page.locator("#legal-hold").click()
    console.confirm()
    console.wait("stream")
    expect(page.locator(".facts-line")).to_contain_text("legal hold")
    page.locator("#close-stream").click()
    console.confirm()
    console.wait("stream")
    expect(page.locator(".facts-line")).to_contain_text("closed")
    info = console.api.get(f"/v1/streams{path}").json()
    assert (info["closed"], info["legal_hold"], info["retention"]["max_events"]) == (True, True, 100)
    console.shot("stream-settings-closed")
    console.offline.errors_expected.add("409")
    console.go(f"#/stream?path={path}&tab=append", "stream")
    page.locator("#append-type").fill("late")
    page.get_by_role("button", name="Append").click()
    expect(page.locator("#append .error")).to_contain_text("stream_closed")


# --- fast, everywhere, by keyboard, in the dark -------------------------------------------------


def test_a_hundred_thousand_events_stay_responsive(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("big")
    batch = [{"type": "tick", "payload": {"i": i}} for i in range(1000)]
    with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {console.server.token}"},
                      timeout=60) as client:
        for _ in range(100):
            assert client.post(f"/v1/streams{path}/-/events", json=batch).status_code == 201
    console.open(f"#/stream?path={path}", "stream")  # how fast: bench/console.py
    expect(page.locator("#events tbody tr")).to_have_count(50)
    expect(page.locator("#head")).to_have_text("100,000")
    expect(page.locator("#events tbody tr").last).to_have_attribute("data-offset", "100000")
    page.get_by_role("link", name="Oldest").click()
    console.wait("stream")
    expect(page.locator("#events tbody tr").first).to_have_attribute("data-offset", "1")
    page.locator("#goto").fill("50001")
    page.locator("#goto").press("Enter")
    console.wait("stream")
    expect(page.locator("#events tbody tr").first).to_have_attribute("data-offset", "50001")
    page.get_by_role("link", name="Older").click()
    console.wait("stream")
    expect(page.locator("#events tbody tr").first).to_have_attribute("data-offset", "49951")
    # Each page is one bounded read: the DOM holds a page, not the stream.
    assert page.locator("tr").count() < 60
    console.shot("stream-100k")


def test_phone_width_keyboard_and_dark_mode(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("phone")
    console.append(path, {"type": "a", "payload": {"text": "x" * 500}})
    for width, height, name in ((1280, 800, "desktop"), (390, 844, "phone")):
        page.set_viewport_size({"width": width, "height": height})
        for route in ("#/", f"#/stream?path={path}", "#/tokens"):
            console.open(route)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, (name, route, overflow)
            console.shot(f"{page_of(route)}-{name}")
    page.set_viewport_size({"width": 1280, "height": 800})
    # By keyboard: the skip link, then the navigation, Enter follows a link.
    console.open("#/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    for _ in range(3):
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Streams"
    page.keyboard.press("Enter")
    console.wait("streams")
    # A confirmation is a modal dialog: Escape cancels it.
    console.go(f"#/stream?path={path}&tab=settings", "stream")
    page.locator("#close-stream").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#confirm")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#confirm")).to_be_hidden()
    assert console.api.get(f"/v1/streams{path}").json()["closed"] is False
    # The system's light or dark preference.
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light != dark
    console.go("#/")
    console.shot("overview-dark")
    page.emulate_media(color_scheme="light")


# --- the remaining actions, empty states, copy buttons ---------------------------------------


def test_empty_states_say_what_to_do_next(console: Console) -> None:
    page = console.page
    console.sign_in_to_a_new_tenant()
    console.open("#/streams")
    expect(page.locator(".empty pre.cmd")).to_contain_text("curl -s -X POST")
    expect(page.locator(".empty pre.cmd")).to_contain_text("/v1/streams/demo/-/events")
    console.shot("streams-empty")
    console.go("#/actors")
    expect(page.locator(".empty")).to_contain_text("No actor instances yet")
    console.go("#/subscriptions")
    expect(page.locator(".empty")).to_contain_text("No subscriptions in this tenant yet")
    console.offline.errors_expected.add("404")  # the missing stream's info, asked on purpose
    console.go("#/stream?path=/nothing-here", "stream")
    expect(page.locator(".empty")).to_contain_text("does not exist yet")
    expect(page.locator(".empty pre.cmd")).to_contain_text("/v1/streams/nothing-here/-/events")
    console.go("#/")
    expect(page.locator("main")).to_contain_text("No dead letters.")


def test_copy_buttons_copy_the_event(console: Console) -> None:
    page = console.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=console.url)
    console.sign_in()
    path = unique("copied")
    console.append(path, {"type": "copy.me", "payload": {"n": 42}})
    console.open(f"#/event?path={path}&offset=1")
    page.get_by_role("button", name="Copy payload").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()").replace(" ", "").replace("\n", "") == '{"n":42}'
    page.get_by_role("button", name="Copy id").click()
    event = console.api.get(f"/v1/streams{path}/-/events/1").json()
    assert page.evaluate("navigator.clipboard.readText()") == event["id"]


def test_dead_letters_dropped_one_and_all_redriven_all(console: Console) -> None:
    page = console.page
    console.sign_in_to_a_new_tenant()
    path = unique("drops")
    console.append(path, *({"type": "flaky.fail", "payload": {"n": n}} for n in range(4)))
    flaky = poll(lambda: console.api.get("/v1/instances", params={"actor": "flaky"}).json()["instances"], "flaky")
    instance_id = flaky[0]["id"]
    dlq = f"/v1/instances/{instance_id}/dlq"
    rows = poll(lambda: len(r := console.api.get(dlq).json()["rows"]) == 4 and r, "four dead rows")
    console.open(f"#/instance?id={instance_id}&tab=dead", "instance")
    page.locator(f'tr[data-qid="{rows[0]["qid"]}"] input.pick').check()
    page.locator("#drop-selected").click()
    console.confirm()
    expect(page.locator(".tab-body .ok")).to_have_text("Dropped: 1.")
    expect(page.locator("table.rows tbody tr")).to_have_count(3)
    assert [r["qid"] for r in console.api.get(dlq).json()["rows"]] == [r["qid"] for r in rows[1:]]
    page.locator("#redrive-selected").click()  # nothing selected: said in place
    expect(page.locator(".tab-body .error")).to_contain_text("nothing_selected")
    console.append(path, {"type": "flaky.heal"})
    poll(lambda: (console.api.get(f"/v1/instances/{instance_id}").json()["state"]["value"] or {}).get("healed"),
         "healed")
    page.locator("#redrive-all").click()
    console.confirm()
    expect(page.locator(".tab-body .ok")).to_have_text("Redriven: 3.")
    poll(lambda: (console.api.get(f"/v1/instances/{instance_id}").json()["state"]["value"] or {}).get("done") == 3,
         "the three redriven rows processed")
    console.append(path, {"type": "flaky.other"})
    console.go(f"#/instance?id={instance_id}&tab=queue", "instance")
    console.go(f"#/instance?id={instance_id}&tab=dead", "instance")
    expect(page.locator(".tab-body .empty")).to_contain_text("No dead letters")


def test_a_subscription_cursor_moved_then_removed(console: Console) -> None:
    page = console.page
    console.sign_in()
    path = unique("copies")
    console.append(path, {"type": "a"}, {"type": "b"}, {"type": "c"})
    made = console.api.post(f"/v1/streams{path}/-/subscriptions", json={
        "name": "mirror", "receiver": {"kind": "copy", "target": path + "/mirror"}, "start": "beginning",
    })
    assert made.status_code == 201, made.text
    status_url = f"/v1/streams{path}/-/subscription"
    status = poll(lambda: (s := console.api.get(status_url, params={"name": "mirror"}).json())["lag"] == 0 and s,
                  "the copy caught up")
    console.open(f"#/subscriptions?path={path}")
    row = page.locator('#subscriptions tr[data-name="mirror"]')
    expect(row).to_contain_text("copy →")
    row.locator("[data-action=cursor]").click()
    field = row.locator("input[name=after_offset]")
    expect(field).to_be_visible()
    field.fill("1")
    expect(field).to_have_value("1")
    row.get_by_role("button", name="Move", exact=True).click()
    with page.expect_response(lambda r: "/-/subscription/cursor" in r.url and r.request.method == "POST") as sent:
        console.confirm()
    assert sent.value.status == 200, sent.value.text()
    assert sent.value.request.post_data_json["after_offset"] == 1
    console.wait("subscriptions")
    moved = poll(lambda: (s := console.api.get(status_url, params={"name": "mirror"}).json())["generation"]
                 > status["generation"] and s, "the cursor moved")
    assert moved["processed_through_offset"] >= 1
    console.go(f"#/subscription?path={path}&name=mirror", "subscription")
    expect(page.locator("#history")).to_contain_text("cursor_set")
    page.locator("[data-action=remove]").click()
    console.confirm()
    console.wait("subscriptions")
    expect(page.locator("main .empty")).to_contain_text("No subscriptions on")
    assert console.api.get(status_url, params={"name": "mirror"}).status_code == 404
