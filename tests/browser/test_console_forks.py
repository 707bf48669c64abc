"""Forks in the console, in a real headless Chromium against a real ``yoke
serve --app tests.http.console_app:app`` on SQLite and PostgreSQL: an
instance's kept inputs listed, a fork made from its Forks tab with an edit
that fixes its dead letter, the fork's page showing the diff side by side
(the failed input now done, the state that changes) and its runs, then
discarded; a read-only session sees no fork form. Same rules as
test_console.py: nothing beyond 127.0.0.1, no script error."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import Console, poll, unique
from tests.http.conftest import Server


@pytest.fixture
def console(page: Any, console_server: Server, offline: Any) -> Console:
    return Console(page, console_server, offline)


def test_an_instance_forked_with_a_fix_and_its_diff_side_by_side(console: Console) -> None:
    page = console.page
    tenant = console.sign_in_to_a_new_tenant()
    jobs = unique("jobs")
    console.append(jobs, {"type": "flaky.ok", "payload": "first"}, {"type": "flaky.fail", "payload": "second"})
    [dead] = poll(lambda: console.api.get("/v1/failures").json()["failures"], "the dead letter")
    iid = dead["instance_id"]

    console.open(f"#/instance?id={iid}&tab=inputs", "instance")
    rows = page.locator("#inputs tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator('#inputs tr[data-seq="2"]')).to_contain_text("dead")
    console.shot("instance-inputs")

    console.go(f"#/instance?id={iid}&tab=forks", "instance")
    expect(page.locator(".empty")).to_contain_text("No forks of this instance")
    page.locator("#fork-edits").fill('[{"seq": 2, "action": "replace", "type": "flaky.heal"}]')
    page.locator("#fork-make").click()
    console.wait("fork")
    expect(page.locator("#diff-verdict")).to_contain_text("differs from the live instance")
    state = page.locator("#diff-state tr.added")
    expect(state).to_have_count(1)
    expect(state).to_contain_text("healed")
    inputs = page.locator("#diff-inputs")
    expect(inputs).to_contain_text("failed: RuntimeError: flaky refuses second")
    expect(inputs).to_contain_text("done")
    expect(page.locator("#runs tbody tr")).to_have_count(2)
    expect(page.locator("#runs")).to_contain_text("edited")
    console.shot("fork")

    # Listed on its instance; then discarded from its own page.
    [fork] = console.api.get("/v1/forks", params={"instance_id": iid}).json()["forks"]
    console.go(f"#/instance?id={iid}&tab=forks", "instance")
    expect(page.locator(f'#forks tr[data-fork="{fork["fork_id"]}"]')).to_contain_text("this application")
    page.locator(f'#forks tr[data-fork="{fork["fork_id"]}"] a').click()
    console.wait("fork")
    page.locator("#fork-discard").click()
    console.confirm()
    console.wait("instance")
    expect(page.locator(".empty")).to_contain_text("No forks of this instance")
    assert console.api.get("/v1/forks").json()["forks"] == []

    # A read-only session reads inputs and forks but cannot make one.
    made = console.api.post(f"/v1/instances/{iid}/forks", json={})
    assert made.status_code == 201, made.text
    page.get_by_role("button", name="Sign out").click()
    console.wait("sign-in")
    page.locator("#token").fill(console.server.new_token(tenant, "read"))
    page.get_by_role("button", name="Sign in").click()
    console.wait("overview")
    console.go(f"#/instance?id={iid}&tab=forks", "instance")
    expect(page.locator("#forks tbody tr")).to_have_count(1)
    expect(page.locator("#fork-form")).to_have_count(0)
    console.go(f"#/fork?id={made.json()['fork_id']}", "fork")
    expect(page.locator("#diff-verdict")).to_contain_text("No difference")
    expect(page.locator("#fork-discard")).to_have_count(0)
