"""The commands over HTTP and on the database, through the real CLI against
a real server: tenants, missing streams, tables, readable values, --json on
every command, --version."""

from __future__ import annotations

import json
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

import yoke
from yoke.cli import main

from .conftest import FAST, ROOT, Cli, clean_env, yoke as run_yoke


def fresh(prefix: str) -> str:
    return f"/{prefix}/{uuid.uuid4().hex[:10]}"


def leaves(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    if isinstance(command, click.Group):
        return [leaf for name, sub in command.commands.items() for leaf in leaves(sub, (*path, name))]
    return [(path, command)]


def check_table(text: str, columns: list[tuple[str, str]]) -> list[str]:
    """``text`` is a header row of ``columns`` ((name, "<" or ">")) and rows
    aligned under it; returns the rows."""
    header, *rows = text.rstrip("\n").split("\n")
    assert re.split(r" {2,}", header.strip()) == [name for name, _ in columns], header
    assert rows, "a table without rows"
    at = 0
    for n, (name, align) in enumerate(columns):
        start = header.index(name, at)
        end = start + len(name)
        at = end
        for row in rows:
            if align == "<":  # left-aligned: every row's value starts where the header does
                assert row[start] != " " and (start == 0 or row[start - 2:start] == "  "), (name, row)
            else:  # right-aligned: values end where the header ends
                assert row[end - 1] != " " and (len(row) == end or row[end] == " "), (name, row)
    return rows


# --- tenants and streams that do not exist -------------------------------------------


def test_tenant_option_and_missing_streams(any_server):
    """The README's quickstart writes /orders in tenant acme: the CLI reads it
    with a token of acme and --tenant acme, and a stream that does not exist
    is an error, not an empty page (on both backends)."""
    cli = Cli(any_server)
    made = cli.db("tokens", "create", "--tenant", "acme", "--scopes", "read,append")
    acme = made.stdout.strip()
    assert made.stdout == acme + "\n" and acme.startswith("yk_")  # the token alone: TOKEN=$(yoke tokens create ...)
    assert "tenant acme" in made.stderr and "shown once" in made.stderr

    cli("append", "/orders", "order.placed", '{"id": 7}', "--tenant", "acme", YOKE_TOKEN=acme)
    assert "order.placed" in cli("read", "/orders", "--tenant", "acme", YOKE_TOKEN=acme).stdout
    assert "/orders" in cli("streams", "--tenant", "acme", YOKE_TOKEN=acme).stdout
    assert cli("read", "/orders", "--tenant", "acme", "--after", "1", YOKE_TOKEN=acme).stdout == (
        "(no events after offset 1)\n"
    )

    # With the server's admin token (tenant default, from .yoke/token-PORT).
    missing = cli("read", "/orders", check=False)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == (
        "error: stream_not_found (404): no stream /orders in tenant default; `yoke streams` lists them, "
        "or name another tenant with --tenant T\n"
    )
    assert cli("read", "/orders", "--json", check=False).returncode == 1
    assert cli("stream", "info", "/orders", check=False).returncode == 1
    assert "/orders" not in cli("streams").stdout
    other = cli("read", "/orders", "--tenant", "acme", check=False)
    assert other.returncode == 1
    assert "belongs to another tenant than acme" in other.stderr
    assert "`yoke tokens create --tenant acme --scopes read,append`" in other.stderr
    missing_in_acme = cli("read", "/nope", "--tenant", "acme", check=False, YOKE_TOKEN=acme)
    assert missing_in_acme.returncode == 1 and "no stream /nope in tenant acme" in missing_in_acme.stderr

    # A stream that exists but is empty is a page without events.
    with any_server.client() as http:
        assert http.put("/v1/streams/empty").status_code in (200, 201)
    assert cli("read", "/empty").stdout == "(no events after offset 0)\n"
    assert json.loads(cli("read", "/empty", "--json").stdout)["events"] == []


# --- human output -----------------------------------------------------------------------


def wait_for(check: Any, what: str, deadline_s: float = 20) -> Any:
    """Poll ``check`` (a state read through the CLI) until it is truthy."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {deadline_s} s"
        time.sleep(0.1)


def test_tables_have_headers_and_aligned_columns(cli, server):
    path = fresh("tbl")
    cli("append", path, "order.placed", '{"id": 7}')
    cli("append", path, "order.paid")
    rows = check_table(cli("read", path).stdout, [("OFFSET", ">"), ("AT", "<"), ("TYPE", "<"), ("PAYLOAD", "<")])
    assert rows[0].split()[-1] == '{"id":7}' and len(rows) == 2

    prefix = path.rsplit("/", 1)[0] + "/"
    rows = check_table(
        cli("streams", prefix).stdout,
        [("PATH", "<"), ("HEAD", ">"), ("EVENTS", ">"), ("BYTES", ">"), ("CLOSED", "<"), ("CREATED", "<")],
    )
    assert any(row.startswith(path) and " no " in row for row in rows)

    rows = check_table(
        cli.db("tokens", "list").stdout,
        [("TOKEN ID", "<"), ("TENANT", "<"), ("SCOPES", "<"), ("CREATED", "<"), ("STATE", "<"), ("NAME", "<")],
    )
    assert any("default" in row and "admin" in row and " active " in row and "yoke serve admin" in row for row in rows)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[0])

    key = uuid.uuid4().hex[:8]
    assert cli("instances", "create", "counter", "--key", key, "--config", '{"a": 1}').stdout.startswith("created ")
    rows = check_table(
        cli("instances", "list", "--actor", "counter").stdout,
        [("ID", "<"), ("ACTOR", "<"), ("KEY", "<"), ("WORKER", "<"), ("CREATED", "<")],
    )
    assert any(f" counter  {key} " in f" {row} " or key in row.split() for row in rows)

    add = ("subscriptions", "add", path, "--name", "audit", "--copy-to", path + "-copy")
    assert cli(*add, "--start", "beginning").stdout.startswith(f"created audit on {path} ")
    assert cli(*add, "--start", "beginning").stdout.startswith(f"exists  audit on {path} ")  # identical: nothing
    assert cli(*add, "--start", "now").stdout.startswith(f"replaced audit on {path} ")  # one flag changed
    assert cli(*add, "--start", "beginning").stdout.startswith(f"replaced audit on {path} ")
    rows = check_table(
        cli("subscriptions", "list", path).stdout,
        [("NAME", "<"), ("RECEIVER", "<"), ("THROUGH", ">"), ("LAG", ">"), ("STATE", "<"), ("LAST ERROR AT", "<")],
    )
    assert rows[0].startswith("audit ") and f"copy to {path}-copy" in rows[0]

    flaky = json.loads(cli("instances", "create", "flaky", "--key", key, "--json").stdout)["id"]
    cli("append", fresh("jobs"), "flaky.fail", '"first"')
    wait_for(lambda: json.loads(cli("instances", "show", flaky, "--json").stdout)["queue"]["dead"] == 1, "dead row")
    rows = check_table(
        cli("dlq", "list", flaky).stdout,
        [("QID", ">"), ("ATTEMPTS", ">"), ("EVENT", "<"), ("TYPE", "<"), ("ERROR", "<")],
    )
    assert "flaky.fail" in rows[0] and rows[0].endswith("RuntimeError: flaky refuses first")
    assert cli("dlq", "drop", flaky).stdout == f"dropped 1 row(s) of {flaky}\n"
    assert cli("dlq", "list", flaky).stdout == "(no dead rows)\n"


def test_instance_schedules_and_sql(cli):
    key = uuid.uuid4().hex[:10]
    planner = json.loads(cli("instances", "create", "planner", "--key", key, "--json").stdout)["id"]
    cli("append", fresh("plans"), "plan.made", '{"name": "a b", "qty": 2}')
    wait_for(lambda: "nightly" in cli("instances", "schedules", planner).stdout, "the schedule")
    [row] = check_table(
        cli("instances", "schedules", planner).stdout,
        [("NAME", "<"), ("DUE", "<"), ("CRON", "<"), ("STREAM", "<"), ("EVENT", "<")],
    )
    assert row.startswith("nightly ") and "0 3 * * *" in row and '"plan.review"' in row
    # By ACTOR/KEY too; the rows under their column names, text as it is, NULL for null.
    out = cli("instances", "sql", f"planner/{key}", "SELECT name, qty, note FROM plans WHERE qty > ?",
              "--params", "[1]").stdout
    assert out.splitlines() == ["name  qty  note", "a b   2    NULL"]
    as_json = json.loads(cli("instances", "sql", planner, "SELECT qty FROM plans", "--json").stdout)
    assert as_json == {"columns": ["qty"], "rows": [[2]], "truncated": False}
    cut = cli("instances", "sql", planner, "SELECT 1 UNION ALL SELECT 2", "--max-rows", "1").stdout
    assert cut.splitlines()[-1] == "(the first 1 rows: --max-rows for more)"
    refused = cli("instances", "sql", planner, "DELETE FROM plans", check=False)
    assert refused.returncode != 0 and "invalid_input" in refused.stderr and "Traceback" not in refused.stderr
    bad = cli("instances", "sql", planner, "SELECT 1", "--params", '{"a": 1}', check=False)
    assert bad.returncode != 0 and "--params is a JSON list" in bad.stderr


def test_readable_values(cli):
    path = fresh("values")
    cli("append", path, "x")
    info = cli("stream", "info", path).stdout
    for python_word in ("True", "False", "None"):
        assert python_word not in info
    assert re.search(r"^closed +no$", info, re.M) and re.search(r"^legal hold +no$", info, re.M)
    assert re.search(r"^retention +max_age_s=unlimited  max_events=unlimited$", info, re.M)
    cli("stream", "hold", path, "on")
    assert re.search(r"^legal hold +yes$", cli("stream", "info", path).stdout, re.M)
    key = uuid.uuid4().hex[:8]
    iid = json.loads(cli("instances", "create", "counter", "--key", key, "--json").stdout)["id"]
    shown = cli("instances", "show", iid).stdout
    assert "None" not in shown and re.search(r"^parent +-$", shown, re.M)


# --- --json everywhere ----------------------------------------------------------------------


def test_every_command_takes_json():
    missing = [" ".join(path) for path, command in leaves(main) if "as_json" not in {p.name for p in command.params}]
    assert missing == []


def test_json_output_of_every_command(cli, server, tmp_path):
    """Each command's --json prints JSON (``serve --json``: test_serve)."""
    covered = {("serve",)}

    def js(*args: str, db: bool = False, **env: str) -> Any:
        covered.add(tuple(a for a in args[:2] if not a.startswith("/") and not a.startswith("-"))[:2])
        done = (cli.db if db else cli)(*args, "--json", **env)
        return json.loads(done.stdout)

    path = fresh("json")
    assert js("append", path, "a.b", '{"n": 1}')["offset"] == 1
    assert [e["type"] for e in js("read", path)["events"]] == ["a.b"]
    assert [s["path"] for s in js("streams", path)] == [path]
    assert js("stream", "info", path)["head"] == 1
    # sql: one JSON object per row.
    done = cli("sql", "SELECT path, head FROM yoke.streams WHERE path = ?", "--params", json.dumps([path]), "--json")
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"path": path, "head": 1}]
    covered.add(("sql",))
    assert js("stream", "retention", path, "--max-events", "50")["retention"]["max_events"] == 50
    assert js("stream", "hold", path, "off")["legal_hold"] is False

    added = js("subscriptions", "add", path, "--name", "j", "--copy-to", path + "-copy", "--start", "beginning")
    assert added["name"] == "j" and added["created"] is True
    assert [s["name"] for s in js("subscriptions", "list", path)] == ["j"]
    waited = js("subscriptions", "wait", path, "j")
    assert waited["processed_through_offset"] == waited["head"] == 2  # the event and the configuration
    assert js("subscriptions", "show", path, "j")["config"]["target"] == path + "-copy"
    assert js("subscriptions", "cursor", path, "j", "0")["name"] == "j"
    assert js("subscriptions", "pause", path, "j")["state"] == "parked"
    assert js("subscriptions", "halt", path, "j")["state"] == "halted"
    assert js("subscriptions", "resume", path, "j")["state"] == "running"
    assert js("subscriptions", "remove", path, "j") == {"removed": "j", "path": path}

    key = uuid.uuid4().hex[:8]
    created = js("instances", "create", "counter", "--key", key)
    assert created["created"] is True
    assert created["id"] in [i["id"] for i in js("instances", "list", "--actor", "counter", "--limit", "1000")]
    assert js("instances", "show", created["id"])["queue"]["dead"] == 0
    assert js("dlq", "list", created["id"]) == []
    assert js("dlq", "redrive", created["id"]) == {"redriven": 0}
    assert js("dlq", "drop", created["id"]) == {"dropped": 0}
    assert js("instances", "schedules", created["id"]) == []
    assert js("instances", "sql", created["id"], "SELECT 7 AS n") == {"columns": ["n"], "rows": [[7]], "truncated": False}
    flaky = js("instances", "create", "flaky", "--key", uuid.uuid4().hex)["id"]
    cli("append", fresh("jobs"), "flaky.fail", '"json"')
    [failure] = wait_for(lambda: js("failures", "list", "--instance", flaky), "its dead letter in the inbox")
    assert js("failures", "show", failure["id"])["error"] == failure["error"]
    assert js("failures", "replay", failure["id"])["action"] == "replayed"  # fails again: parked again
    wait_for(lambda: js("failures", "list", "--instance", flaky), "parked again")
    forked = js("failures", "fork", failure["id"], "--event", '{"type": "flaky.heal"}')
    assert forked["upto"] == 2 and forked["edits"][0]["type"] == "flaky.heal"
    assert js("failures", "discard", failure["id"], "--reason", "json")["action"] == "discarded"
    # The flaky run's input, kept: dead-lettered (its replay too), its event as sent.
    kept = js("instances", "inputs", flaky)
    assert [i["outcome"] for i in kept["inputs"]] == ["dead", "dead"] and kept["next_after"] is None
    assert kept["inputs"][0]["event"]["type"] == "flaky.fail" and kept["inputs"][0]["seq"] == 1
    # A fork of it, with the failing event dropped: its state is the live one's, its runs one fewer.
    # (Input 2 is input 1's row run again by the replay: a fork replays it once, as input 2.)
    fork = js("instances", "fork", flaky, "--drop", "2")
    assert fork["summary"]["runs"] == 0 and fork["edits"] == [{"seq": 2, "action": "drop"}]
    assert [f["fork_id"] for f in js("forks", "list", "--instance", flaky)] == sorted([fork["fork_id"], forked["fork_id"]])
    assert js("forks", "show", fork["fork_id"]) == fork
    assert js("forks", "runs", fork["fork_id"])["runs"] == []
    assert js("forks", "state", fork["fork_id"]) == {"value": None, "version": 0}
    assert js("forks", "sql", fork["fork_id"], "SELECT 7 AS n")["rows"] == [[7]]
    diff = js("forks", "diff", fork["fork_id"])
    assert diff["changed"] is True and [o["seq"] for o in diff["outcomes"]] == [2]
    assert js("forks", "discard", fork["fork_id"])["fork_id"] == fork["fork_id"]
    assert js("instances", "remove", created["id"])["id"] == created["id"]

    new = js("tokens", "create", "--tenant", "jsonland", "--name", "j", db=True)
    assert new["tenant"] == "jsonland" and new["token"].startswith("yk_")
    assert [t["token_id"] for t in js("tokens", "list", "--tenant", "jsonland", db=True)] == [new["token_id"]]
    assert js("tokens", "revoke", new["token_id"], "--tenant", "jsonland", db=True) == {
        "revoked": new["token_id"], "tenant": "jsonland"
    }
    assert js("migrate", db=True)["applied"] == []
    js("instances", "create", "counter", "--key", uuid.uuid4().hex[:8])  # one to check, whatever ran before
    checked = js("check-deploy", "--app", "tests.http.actor_app:app", "--actor", "counter", "--instances", "3", db=True,
                 PYTHONPATH=str(ROOT))
    assert checked["diverged"] == 0 and checked["errors"] == 0 and checked["checked"] >= 1
    # backup of the running server, then restore into a new place.
    backed = js("backup", str(tmp_path / "bk"), db=True)
    assert backed["database"] == "yoke.db" and backed["instances"] >= 0
    restored = js("restore", str(tmp_path / "bk"), "--db", f"sqlite:///{tmp_path}/r/yoke.db", db=True,
                  YOKE_DATA_DIR=str(tmp_path / "r" / ".yoke"))
    assert restored["database_url"] == f"sqlite:///{tmp_path}/r/yoke.db"

    # demo (its own database): the tailed events as JSON lines.
    demo = run_yoke("demo", "--json", "--db", f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path)
    events = [json.loads(line) for line in demo.stdout.splitlines()]
    assert [e["type"] for e in events] == ["order.placed"] * 3 + ["order.progress", "order.shipped"]
    covered.add(("demo",))

    # tail: one JSON line per event.
    tail = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "tail", path, "--json", "--url", server.url], cwd=cli.cwd,
        env=clean_env(), stdout=subprocess.PIPE, text=True,
    )
    try:
        assert json.loads(tail.stdout.readline())["type"] == "a.b"
    finally:
        tail.terminate()
        tail.wait(10)
    covered.add(("tail",))

    # worker: a JSON line once it runs.
    worker = subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "worker", "--app", "tests.http.actor_app:app", "--json"], cwd=cli.cwd,
        env=clean_env(YOKE_DATABASE_URL=server.db_url, **FAST), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([worker.stdout], [], [], 60)
        assert ready, "yoke worker --json printed nothing within 60 s"
        assert json.loads(worker.stdout.readline())["app"] == "tests.http.actor_app:app"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    covered.add(("worker",))

    assert js("stream", "close", path)["closed"] is True
    assert js("stream", "delete", path, "--yes")["path"] == path
    assert {path for path, _ in leaves(main)} <= covered


# --- version ---------------------------------------------------------------------------------


def test_version(tmp_path):
    """From this checkout: the version and its commit."""
    root = Path(yoke.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for flag in ("--version", "-V"):
        printed = run_yoke(flag, cwd=tmp_path).stdout
        assert re.fullmatch(rf"yoke {re.escape(yoke.__version__)}\+{head}(\.dirty)?\n", printed), printed


def test_version_tells_builds_apart(tmp_path):
    """Two builds of one version (two commits of a copy of the package)
    print two versions; outside a checkout, the version alone."""
    shutil.copytree(Path(yoke.__file__).parent, tmp_path / "yoke",
                    ignore=shutil.ignore_patterns("__pycache__", "node_modules"))

    def version() -> str:
        env = {**clean_env(), "PYTHONPATH": str(tmp_path)}
        return subprocess.run([sys.executable, "-m", "yoke.cli", "--version"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=True).stdout

    assert version() == f"yoke {yoke.__version__}\n"  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = version()
    (tmp_path / "yoke" / "events.py").write_text((tmp_path / "yoke" / "events.py").read_text() + "\n")
    assert version() == first.replace("\n", ".dirty\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    second = version()
    assert first != second
    for printed in (first, second):
        assert re.fullmatch(rf"yoke {re.escape(yoke.__version__)}\+[0-9a-f]{{12}}\n", printed), printed
