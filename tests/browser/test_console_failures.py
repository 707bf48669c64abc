"""The console's failures page in a real headless Chromium, against a real
``yoke serve --app tests.http.console_app:app`` on SQLite and PostgreSQL: a
dead letter and a halted copy listed in one table, filtered, one replayed
with a corrected event from its own page, the other discarded with a reason;
a read-only session sees no write buttons. Same rules as test_console.py:
nothing beyond 127.0.0.1, no script error."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import Console, poll, unique
from tests.http.conftest import Server

POISON_COPY = 'payload.poison ? "not an object" : {"payload": payload}'


@pytest.fixture
def console(page: Any, console_server: Server, offline: Any) -> Console:
    return Console(page, console_server, offline)


def parked(console: Console) -> tuple[str, str, dict, dict]:
    """A tenant of its own with a dead letter (the flaky actor) and a halted
    copy (its transform fails on poison): (tenant, source, dead, halted)."""
    tenant = console.sign_in_to_a_new_tenant()
    source = unique("orders")
    made = console.api.post(f"/v1/streams{source}/-/subscriptions", json={
        "name": "archive", "receiver": {"kind": "copy", "target": source + "/archive"},
        "filter": {"types": ["order"]}, "transform": POISON_COPY, "start": "beginning",
    })
    assert made.status_code == 201, made.text
    console.append(source, {"type": "order", "payload": {"n": 1, "poison": True}}, {"type": "flaky.fail"})
    failures = poll(lambda: len(f := console.api.get("/v1/failures").json()["failures"]) == 2 and f,
                    "a dead letter and a halt")
    by_kind = {f["kind"]: f for f in failures}
    return tenant, source, by_kind["dead_letter"], by_kind["halted"]


def test_failures_listed_filtered_replayed_corrected_and_discarded(console: Console) -> None:
    page = console.page
    _, source, dead, halted = parked(console)
    console.open("#/failures")
    rows = page.locator("#failures tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator(f'tr[data-id="{halted["id"]}"]')).to_contain_text("copy archive")
    expect(page.locator(f'tr[data-id="{dead["id"]}"]')).to_contain_text("flaky refuses")
    console.shot("failures")

    page.locator("#filter-kind").select_option("halted")
    page.locator("#failure-filter button[type=submit]").click()
    console.wait("failures")
    expect(rows).to_have_count(1)
    expect(page).to_have_url(f"{console.url}/ui/#/failures?kind=halted")

    # The halt, from its own page: replayed with a corrected event.
    page.locator(f'tr[data-id="{halted["id"]}"] a').first.click()
    console.wait("failure")
    expect(page.locator("#attempts")).to_contain_text("InvalidTransform")
    expect(page.locator(".card pre.json").first).to_contain_text('"poison": true')
    console.shot("failure")
    page.locator("#correction").fill('{"payload": {"n": 1}}')
    page.locator("#replay-corrected").click()
    console.confirm()
    expect(page.locator("#failure-actions .ok")).to_contain_text("Replayed corrected")
    copied = poll(lambda: [e for e in console.api.get(f"/v1/streams{source}/archive/-/events").json()["events"]
                           if e["type"] == "order"], "the corrected copy")
    assert [e["payload"] for e in copied] == [{"n": 1}]
    console.wait("failures")  # back to the list

    # The dead letter: a reason is asked for, then it is discarded.
    console.go("#/failures")
    expect(rows).to_have_count(1)
    page.locator(f'tr[data-id="{dead["id"]}"] input.pick').check()
    page.locator("#discard-selected").click()
    expect(page.locator(".error")).to_contain_text("reason_needed")
    page.locator("#discard-reason").fill("not a real job")
    page.locator("#discard-selected").click()
    console.confirm()
    expect(page.locator("p.ok")).to_have_text("Discarded: 1.")
    poll(lambda: console.api.get("/v1/failures").json()["failures"] == [], "an empty inbox")
    console.go("#/stream?path=/", "stream")
    console.go("#/failures")
    expect(page.locator(".empty")).to_contain_text("No failures")
    audit = [e for e in console.api.get(f"/v1/streams{source}/-/events").json()["events"]
             if e["type"].startswith("yoke.failure.")]
    assert [(e["type"], e["payload"].get("reason")) for e in audit] == [
        ("yoke.failure.replayed", None), ("yoke.failure.discarded", "not a real job")]


def test_replay_all_and_a_read_only_session(console: Console) -> None:
    page = console.page
    tenant, source, dead, halted = parked(console)
    console.open(f"#/failures?stream={source}")
    expect(page.locator("#failures tbody tr")).to_have_count(2)
    page.locator("#replay-all").click()
    console.confirm()
    expect(page.locator("p.ok")).to_have_text("Replayed: 2.")
    # Still poisoned: the copy halts again and the dead letter dies again, under new ids or the same.
    poll(lambda: len(console.api.get("/v1/failures").json()["failures"]) == 2, "parked again")
    page.get_by_role("button", name="Sign out").click()
    console.wait("sign-in")
    page.locator("#token").fill(console.server.new_token(tenant, "read"))
    page.get_by_role("button", name="Sign in").click()
    console.wait("overview")
    console.go("#/failures")
    expect(page.locator("#who")).to_contain_text(f"{tenant} · read")
    expect(page.locator("#failures tbody tr")).to_have_count(2)
    expect(page.locator("#failure-actions")).to_have_count(0)
    expect(page.locator("input.pick")).to_have_count(0)
    console.go(f"#/failure?id={dead['id']}", "failure")
    expect(page.locator("#attempts")).to_contain_text("flaky refuses")
    expect(page.locator("#failure-actions")).to_have_count(0)
