"""/docs (Swagger UI) and /redoc in a real headless Chromium, offline.

Every request the pages make beyond 127.0.0.1 is blocked and fails the test
(conftest ``page``): the scripts and styles come from Yoke itself
(``/docs/assets``, out of the fastapi-offline package). On /docs a person's
first steps: the operation list, Authorize with the admin token, "Try it
out" on the append route with its example body, Execute: 201, and the event
is in the stream.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.http.conftest import Server

APPEND = "/v1/streams{path}/-/events"


def operation(page: Any, method: str, path: str) -> Any:
    return page.locator(f".opblock-{method}").filter(has=page.locator(f'.opblock-summary-path[data-path="{path}"]'))


def test_docs_lists_the_operations_offline(page: Any, server: Server) -> None:
    page.goto(server.url + "/docs")
    expect(page.locator(".opblock").first).to_be_visible()
    documented = httpx.get(server.url + "/openapi.json").json()["paths"]
    count = sum(len(item) for item in documented.values())
    expect(page.locator(".opblock")).to_have_count(count)
    expect(operation(page, "post", APPEND)).to_be_visible()
    assert "Yoke" in page.locator(".info .title").inner_text()


def test_try_it_out_appends_with_the_example_body(page: Any, server: Server) -> None:
    page.goto(server.url + "/docs")

    # Authorize with the admin token (the bearer scheme of the document).
    page.locator(".auth-wrapper .authorize").click()
    dialog = page.locator(".dialog-ux")
    dialog.locator("input").first.fill(server.token)
    dialog.locator("button.authorize").click()
    dialog.locator("button.btn-done").click()
    expect(dialog).to_have_count(0)

    append = operation(page, "post", APPEND)
    append.locator(".opblock-summary").click()
    append.locator(".try-out__btn").click()
    path_input = append.locator('tr[data-param-name="path"] input')
    expect(path_input).to_have_value("/orders")  # the parameter's example, filled in
    path_input.fill("/docs-try-it-out")
    body = append.locator("textarea.body-param__text")
    expect(body).to_have_value(re.compile(r'"type": "order\.placed"'))  # the first example, filled in
    append.locator("button.execute").click()

    answer = append.locator(".live-responses-table tr.response")
    expect(answer.locator(".response-col_status")).to_have_text("201")
    expect(answer.locator(".response-col_description")).to_contain_text('"offset": 1')

    events = httpx.get(
        server.url + "/v1/streams/docs-try-it-out/-/events", headers={"Authorization": f"Bearer {server.token}"}
    ).json()["events"]
    assert [(e["type"], e["payload"]) for e in events] == [("order.placed", {"order_id": "A-1", "total": 42})]


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def test_redoc_renders_offline(page: Any, offline: Any, server: Server) -> None:
    # ReDoc 2 always shows Redocly's logo from its CDN; the page's policy
    # keeps the browser from fetching it, and the logo hides itself.
    offline.refusals_expected.add(REDOC_LOGO)
    page.goto(server.url + "/redoc")
    expect(page.get_by_role("heading", name=re.compile("^Yoke"))).to_be_visible()
    menu = page.locator(".menu-content")
    for tag in ("streams", "objects", "subscriptions", "actors", "workflow streams"):
        expect(menu.get_by_text(tag, exact=True)).to_be_visible()
    # The append operation's section, by the id and tag the document gives it.
    operation_id = httpx.get(server.url + "/openapi.json").json()["paths"][APPEND]["post"]["operationId"]
    append = page.locator(f'[data-section-id="tag/streams/operation/{operation_id}"]')
    expect(append).to_contain_text("Append one event or a batch")
    expect(append).to_contain_text("Request samples")
    expect(append).to_contain_text("order.placed")  # the body's example
