"""``yoke failures list|show|replay|discard`` as a subprocess against a real
``yoke serve --app`` on both backends: tables and --json, one failure and
--all with filters, corrected events, reasons, and the messages of misuse."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from yoke.cli.common import when

from ..http.test_subscriptions_api import Hook
from .conftest import Served
from .test_http import failures, setup_poison, wait_for


def cli(served: Served, token: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return served.server.cli(*args, "--url", served.server.url, "--token", token, check=check)


def base64url(failure_id: str) -> bytes:
    """The coordinates a failure id encodes (a dead letter's: [qid])."""
    body = failure_id.split("_", 1)[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A local webhook receiver answering ``hook.status`` (500 at first)."""
    h = Hook()
    try:
        yield h
    finally:
        h.close()


def test_cli_lists_shows_replays_and_discards(served: Served, admin: httpx.Client) -> None:
    token = admin.headers["Authorization"].split()[1]
    got = setup_poison(admin)
    dead, halted, skipped = (got["by_kind"][k] for k in ("dead_letter", "halted", "skipped"))

    table = cli(served, token, "failures", "list").stdout
    assert table.splitlines()[0].split() == ["ID", "KIND", "EVENT", "TO", "FAILED", "ATTEMPTS", "ERROR"]
    assert all(f["id"] in table for f in (dead, halted, skipped))
    assert "orders " + dead["instance_id"] in table and "copy archive" in table
    listed = orjson.loads(cli(served, token, "failures", "list", "--kind", "halted", "--json").stdout)
    assert [f["id"] for f in listed] == [halted["id"]]
    assert orjson.loads(cli(served, token, "failures", "list", "--since", "1h", "--receiver", "call",
                            "--json").stdout)[0]["id"] == skipped["id"]
    assert "(no failures" in cli(served, token, "failures", "list", "--stream", "/nowhere").stdout

    shown = cli(served, token, "failures", "show", dead["id"]).stdout
    assert "ValueError: poisoned order 1" in shown and "attempt 2" in shown and "Traceback" in shown
    assert orjson.loads(cli(served, token, "failures", "show", dead["id"], "--json").stdout) == dead

    # Patched: the poison member removed, n kept.
    out = cli(served, token, "failures", "replay", dead["id"], "--patch", '{"payload": {"poison": null}}').stdout
    assert out.startswith(f"replayed {dead['id']} (audit event /s@")
    wait_for(lambda: admin.get(f"/v1/instances/{got['instance']['id']}").json()["state"]["value"],
             lambda state: sorted(state.get("seen", [])) == [1, 2])
    out = cli(served, token, "failures", "discard", halted["id"], "--reason", "archive does not need it").stdout
    assert out.startswith(f"discarded {halted['id']}")
    bulk = orjson.loads(cli(served, token, "failures", "replay", "--all", "--kind", "skipped",
                            "--event", '{"payload": {"n": 1}}', "--json").stdout)
    assert [d["id"] for d in bulk["done"]] == [skipped["id"]] and bulk["failed"] == []
    assert failures(admin) == []
    audit = [e for e in admin.get("/v1/streams/s/-/events").json()["events"] if e["type"].startswith("yoke.failure.")]
    assert [e["payload"]["failure"] for e in audit] == [dead["id"], halted["id"], skipped["id"]]
    assert audit[1]["payload"]["reason"] == "archive does not need it"


def test_cli_bulk_discard_and_misuse(served: Served, admin: httpx.Client) -> None:
    token = admin.headers["Authorization"].split()[1]
    got = setup_poison(admin)
    dead = got["by_kind"]["dead_letter"]
    # As it is: still poisoned, the instance fails it again and it is parked again (same id).
    out = cli(served, token, "failures", "replay", dead["id"]).stdout
    assert out.startswith(f"replayed {dead['id']} (audit event /s@")
    wait_for(lambda: failures(admin, kind="dead_letter"),
             lambda fs: len(fs) == 1 and fs[0]["id"] == dead["id"] and fs[0]["failed_at"] > dead["failed_at"])
    # --all exits 1 when any failed: the skipped event, replayed as it is, fails the receiver again.
    partial = cli(served, token, "failures", "replay", "--all", "--kind", "skipped", check=False)
    assert partial.returncode == 1 and partial.stdout.splitlines()[-1] == "0 done, 1 failed"
    assert "replay_failed" in partial.stdout
    out = cli(served, token, "failures", "discard", "--all", "--stream", "/s", "--reason", "test data").stdout
    assert out.splitlines()[-1] == "3 done, 0 failed"
    wait_for(lambda: failures(admin), lambda fs: fs == [])
    for args, message in [
        (("failures", "replay"), "give a failure id"),
        (("failures", "replay", "dl_x", "--all"), "not both"),
        (("failures", "discard", "dl_WzFd"), "--reason"),
        (("failures", "show", "dl_WzEyMzQ1XQ"), "failure_not_found"),
        (("failures", "list", "--since", "yesterday"), "--since takes"),
        # Outside what the server takes (signed 64 bits, not before 1970), or
        # beyond int()'s digits or a float's range: a message, not a traceback.
        (("failures", "list", "--since", str(2**63)), "--since takes ms since the epoch (0 to"),
        (("failures", "list", "--until", "1" * 40), "--until takes"),
        (("failures", "list", "--since", "9" * 5000), "--since takes"),
        (("failures", "list", "--since", "9" * 400 + "d"), "--since takes"),
        (("failures", "list", "--since", "99999999999d"), "not before 1970"),
        (("failures", "list", "--since", "\u00b2"), "--since takes"),
        (("failures", "replay", "dl_WzEyMzQ1XQ", "--event", "{"), "--event is not valid JSON"),
        (("failures", "replay", "dl_WzEyMzQ1XQ", "--patch", "{"), "--patch is not valid JSON"),
        (("failures", "replay", "dl_WzEyMzQ1XQ", "--patch", "{}", "--event", "{}"), "not both"),
    ]:
        done = cli(served, token, *args, check=False)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


# --- replay --wait: the outcome, as a user sees it -------------------------------------


def setup_waiting(http: httpx.Client, hook: Hook) -> dict[str, Any]:
    """A dead letter (a poisoned order for the ``orders`` actor) and a webhook
    subscription halted on an event its receiver refused (500)."""
    inst = http.post("/v1/instances", json={"actor": "orders", "key": "k"}).json()
    made = http.post("/v1/streams/w/-/subscriptions", json={
        "name": "hook", "receiver": {"kind": "webhook", "url": hook.url}, "start": "beginning",
    })
    assert made.status_code == 201, made.text
    assert http.post("/v1/streams/s/-/events", json={"type": "order", "payload": {"n": 1, "poison": True}}).is_success
    assert http.post("/v1/streams/w/-/events", json={"type": "ping", "payload": {"n": 1}}).is_success
    listed = wait_for(lambda: failures(http), lambda fs: len(fs) == 2)
    return {"instance": inst, "by_kind": {f["kind"]: f for f in listed}}


def test_replay_wait_exits_0_once_it_went_through(served: Served, admin: httpx.Client, hook: Hook) -> None:
    token = admin.headers["Authorization"].split()[1]
    got = setup_waiting(admin, hook)
    dead, halted = got["by_kind"]["dead_letter"], got["by_kind"]["halted"]
    halted_status = admin.get("/v1/streams/w/-/subscription", params={"name": "hook"}).json()
    assert halted_status["state"] == "halted" and "answered 500" in halted_status["last_error"]
    assert halted_status["last_error_at"] == halted["attempts"][-1]["at"]  # the halting attempt

    # The dead letter, patched: its row is processed.
    out = cli(served, token, "failures", "replay", dead["id"], "--patch", '{"payload": {"poison": null}}', "--wait")
    first, outcome = out.stdout.splitlines()
    assert first.startswith(f"replayed {dead['id']} (audit event /s@")
    assert outcome == f"done: queue row {orjson.loads(base64url(dead['id']))[0]} of instance" \
                      f" {got['instance']['id']} was processed"
    # The webhook answers again: the halt replayed as it is goes through.
    hook.status = 204
    done = orjson.loads(cli(served, token, "failures", "replay", halted["id"], "--wait", "--timeout", "20",
                            "--json").stdout)
    assert done["outcome"]["state"] == "done" and done["outcome"]["error"] is None, done
    assert re.fullmatch(rf"hook processed through \d+, past the replayed offset {halted['offset']}",
                        done["outcome"]["detail"]), done
    assert failures(admin) == []
    # Recovered, and still saying when it last failed.
    shown = cli(served, token, "subscriptions", "show", "/w", "hook").stdout
    assert "running" in shown and "halted" not in shown
    [line] = [x for x in shown.splitlines() if x.startswith("last error")]
    assert re.fullmatch(r"last error  \(at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\): WebhookFailed: POST \S+ answered 500 in \d+ ms", line), line
    status = orjson.loads(cli(served, token, "subscriptions", "show", "/w", "hook", "--json").stdout)
    assert status["last_error_at"] == halted_status["last_error_at"]
    listed = cli(served, token, "subscriptions", "list", "/w").stdout
    assert listed.splitlines()[0].split()[-3:] == ["LAST", "ERROR", "AT"] and when(status["last_error_at"]) in listed


def test_replay_wait_exits_1_when_it_fails_again(served: Served, admin: httpx.Client, hook: Hook) -> None:
    token = admin.headers["Authorization"].split()[1]
    got = setup_waiting(admin, hook)
    dead, halted = got["by_kind"]["dead_letter"], got["by_kind"]["halted"]

    # As it is: still poisoned, dead again; the new error printed.
    again = cli(served, token, "failures", "replay", dead["id"], "--wait", check=False)
    assert again.returncode == 1, again
    lines = again.stdout.splitlines()
    assert lines[0].startswith(f"replayed {dead['id']}")
    assert lines[1].startswith("failed again: queue row ") and lines[1].endswith("is dead again after 2 attempt(s)")
    assert re.fullmatch(r"error \(at [-0-9: ]+\): ValueError: poisoned order 1", lines[2]), lines
    # The webhook still refuses: the first failed attempt after the resume is the outcome.
    again = cli(served, token, "failures", "replay", halted["id"], "--wait", "--json", check=False)
    assert again.returncode == 1, again
    outcome = orjson.loads(again.stdout)["outcome"]
    assert outcome["state"] == "failed" and "answered 500" in outcome["error"], outcome
    assert outcome["error_at"] >= halted["failed_at"]
    human = cli(served, token, "failures", "replay", dead["id"], "--wait", "--timeout", "0", check=False)
    assert human.returncode == 1 and human.stdout.splitlines()[1].startswith("still pending: after 0 s, queue row ")
    for args, message in [
        (("failures", "replay", "--all", "--wait"), "--wait waits for one failure id"),
        (("failures", "replay", dead["id"], "--timeout", "5"), "--timeout goes with --wait"),
        (("failures", "replay", dead["id"], "--wait", "--timeout", "61"), "--timeout"),
    ]:
        done = cli(served, token, *args, check=False)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
