"""``yoke failures list|show|replay|discard`` as a subprocess against a real
``yoke serve --app`` on both backends: tables and --json, one failure and
--all with filters, corrected events, reasons, and the messages of misuse."""

from __future__ import annotations

import subprocess

import httpx
import orjson

from .conftest import Served
from .test_http import failures, setup_poison, wait_for


def cli(served: Served, token: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return served.server.cli(*args, "--url", served.server.url, "--token", token, check=check)


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
