"""Fork commands over HTTP (docs/advanced/forks.md): ``instances fork`` and
``failures fork`` make one; ``forks list|show|runs|state|sql|diff|discard``
read and discard them."""

from __future__ import annotations

from typing import Any

import click

from .actors import INSTANCE_ID_HELP, first_line, instance_id_of, instances, sql_lines, sql_params
from .failures import failures
from .common import Column, Remote, argument, compact, emit, fail, group, http_command, parse_json, table, when

FORK_ID_HELP = "a fork's id (fork_..., see `yoke forks list`)"

FORK_COLUMNS: list[Column] = [
    ("FORK", lambda f: f["fork_id"], "<"),
    ("INSTANCE", lambda f: f"{f['actor']}/{f['key']}", "<"),
    ("UPTO", lambda f: "all" if f["upto"] is None else f["upto"], ">"),
    ("EDITS", lambda f: len(f["edits"]), ">"),
    ("RUNS", lambda f: f["summary"]["runs"], ">"),
    ("FAILED", lambda f: f["summary"]["failed"], ">"),
    ("APP", lambda f: f["app"] or "(the server's)", "<"),
    ("EXPIRES", lambda f: when(f["expires_at"]), "<"),
]

RUN_COLUMNS: list[Column] = [
    ("INPUT", lambda r: r["label"] if not r["inserted"] else "+", ">"),
    ("TYPE", lambda r: (r["event"] or {}).get("type", "?") + (" (edited)" if r["edited"] else ""), "<"),
    ("OUTCOME", lambda r: r["outcome"] if r["outcome"] == "done" else f"failed: {first_line(r['error'], 60)}", "<"),
    ("LIVE", lambda r: r["live_outcome"] or "-", "<"),
    ("OPS", lambda r: ", ".join(o["op"] for o in r["ops"]) or "-", "<"),
]


def fork_lines(f: dict[str, Any]) -> str:
    s = f["summary"]
    rows = [
        ("fork", f["fork_id"]),
        ("instance", f"{f['actor']}/{f['key']} ({f['instance_id']})"),
        ("replayed", f"inputs 1..{s['through']} ({s['inputs']} kept)" + ("" if f["upto"] is None else f", upto {f['upto']}")),
        ("app", f["app"] or "(the server's)"),
        ("edits", compact(f["edits"]) if f["edits"] else "-"),
        ("runs", f"{s['runs']} ({s['failed']} failed, {s['effects']} effects, {s['refused']} refused)"),
        ("created", when(f["created_at"])),
        ("expires", when(f["expires_at"])),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def diff_lines(d: dict[str, Any]) -> str:
    """A diff for people: what differs, each side labelled."""
    other = "live" if d["against"] == "live" else d["against"]
    out = [f"{d['fork_id']} against {other}: " + ("differs" if d["changed"] else "no difference")]
    if d["nondeterministic"]:
        out.append("  the same code and inputs differ: the handler reads something outside ctx"
                   " (the wall clock, random numbers: use ctx.now() and ctx.random())")
    state = d["state"]
    if state["added"] or state["removed"] or state["changed"]:
        out.append("state:")
        out += [f"  + {k}: {compact(v)}" for k, v in state["added"].items()]
        out += [f"  - {k}: {compact(v)}" for k, v in state["removed"].items()]
        out += [f"  ~ {k or '(the whole document)'}: {compact(v['live'])} -> {compact(v['fork'])}"
                for k, v in state["changed"].items()]
    for name, t in d["tables"].items():
        out.append(f"table {name}:")
        out += [f"  + {compact(r['key'])} {compact(r['row'])}" for r in t["added"]]
        out += [f"  - {compact(r['key'])} {compact(r['row'])}" for r in t["removed"]]
        out += [f"  ~ {compact(r['key'])} {compact(r['live'])} -> {compact(r['fork'])}" for r in t["changed"]]
    for o in d["outcomes"]:
        out.append(f"input {o['seq']}: {other} {o['live'] or '(none)'}"
                   f"{' (' + first_line(o['live_error'], 60) + ')' if o['live_error'] else ''},"
                   f" fork {o['fork'] or '(none)'}{' (' + first_line(o['fork_error'], 60) + ')' if o['fork_error'] else ''}")
    for e in d["effects"]:
        out.append(f"input {e['seq']} effects:")
        out += [f"  only {other}: {x['op']} {compact(x['params'])}" for x in e["only_live"]]
        out += [f"  only fork: {x['op']} {compact(x['params'])}" for x in e["only_fork"]]
        out += [f"  ~ {x['op']}: {compact(x['live'])} -> {compact(x['fork'])}" for x in e["changed"]]
    return "\n".join(out)


def edits_of(replace: tuple[str, ...], drop: tuple[int, ...], insert: tuple[str, ...]) -> list[dict[str, Any]]:
    edits: list[dict[str, Any]] = []
    for spec in replace:
        seq, _, payload = spec.partition("=")
        if not seq.isdigit() or not payload:
            fail(f"--replace is SEQ=JSON (the input's new payload), like 3='{{\"total\": 10}}', not {spec!r}")
        edits.append({"seq": int(seq), "action": "replace", "payload": parse_json(payload, "--replace")})
    edits += [{"seq": seq, "action": "drop"} for seq in drop]
    for spec in insert:
        seq, _, event = spec.partition("=")
        if not seq.isdigit() or not event:
            fail(f"--insert is SEQ=JSON (an event to insert before input SEQ), not {spec!r}")
        edits.append({"seq": int(seq), "action": "insert", "event": parse_json(event, "--insert")})
    return edits


@instances.command("fork")
@argument("instance_id", INSTANCE_ID_HELP)
@click.option("--upto", default=None, type=click.IntRange(0), metavar="SEQ", help="Replay inputs 1..SEQ (default: all).")
@click.option("--app", "app_spec", default=None, metavar="MODULE:APP",
              help="Replay under this code, loaded by the server (admin scope; default: the server's app).")
@click.option("--replace", multiple=True, metavar="SEQ=JSON", help="Input SEQ's payload replaced (repeatable).")
@click.option("--drop", multiple=True, type=click.IntRange(1), metavar="SEQ", help="Input SEQ left out (repeatable).")
@click.option("--insert", multiple=True, metavar="SEQ=JSON", help="An event inserted before input SEQ (repeatable).")
@http_command
def instances_fork(client: Remote, as_json: bool, instance_id: str, upto: int | None, app_spec: str | None,
                   replace: tuple[str, ...], drop: tuple[int, ...], insert: tuple[str, ...]) -> None:
    """Fork the instance: replay its inputs in a sandbox (nothing live changes),
    under this code or another, edited or not; then `yoke forks diff FORK`."""
    edits = edits_of(replace, drop, insert)
    made = client.fork(instance_id_of(client, instance_id), upto, app_spec, edits or None)
    emit(made, as_json, lambda f: fork_lines(f) + f"\n(next: yoke forks diff {f['fork_id']})")


@failures.command("fork")
@argument("failure_id", "a dead letter's failure id (see `yoke failures list`)")
@click.option("--patch", "patch_json", default=None, metavar="JSON", help="A JSON Merge Patch of the failed event.")
@click.option("--event", "event_json", default=None, metavar="JSON",
              help='The failed event\'s fields replaced whole: {"type", "payload", "metadata"}.')
@click.option("--app", "app_spec", default=None, metavar="MODULE:APP",
              help="Replay under this code, loaded by the server (admin scope).")
@http_command
def failures_fork(client: Remote, as_json: bool, failure_id: str, patch_json: str | None, event_json: str | None,
                  app_spec: str | None) -> None:
    """Fork a dead letter's instance through the failed input, corrected as
    `failures replay` would correct it, or under other code: see what the fix
    does (`yoke forks diff`) before you replay it live."""
    if patch_json is not None and event_json is not None:
        raise click.UsageError("give --patch or --event, not both")
    patch = parse_json(patch_json, "--patch") if patch_json is not None else None
    event = parse_json(event_json, "--event") if event_json is not None else None
    made = client.fork_failure(failure_id, event, patch, app_spec)
    emit(made, as_json, lambda f: fork_lines(f) + f"\n(next: yoke forks diff {f['fork_id']}, then yoke failures replay"
                                              f" {failure_id} with the same correction)")


@group()
def forks() -> None:
    """Forks of instances: list, show, their runs, state and SQL, diff, discard."""


@forks.command("list")
@click.option("--instance", "instance_ref", default=None, metavar="INSTANCE", help="Only forks of this instance.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N", help="At most N.")
@click.option("--after", default=None, metavar="FORK", help="Continue after this fork id (paging).")
@http_command
def forks_list(client: Remote, as_json: bool, instance_ref: str | None, limit: int, after: str | None) -> None:
    """Forks that have not expired, by id."""
    iid = instance_id_of(client, instance_ref) if instance_ref else None
    listed = client.forks(iid, after, limit)["forks"]
    emit(listed, as_json, lambda v: table(v, FORK_COLUMNS, "(no forks)"))


@forks.command("show")
@argument("fork_id", FORK_ID_HELP)
@http_command
def forks_show(client: Remote, as_json: bool, fork_id: str) -> None:
    """What the fork was made from and what its runs did, in sum."""
    emit(client.fork_show(fork_id), as_json, fork_lines)


@forks.command("runs")
@argument("fork_id", FORK_ID_HELP)
@click.option("--after", default=0, show_default=True, type=click.IntRange(0), metavar="N", help="Runs after the Nth.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N", help="At most N.")
@http_command
def forks_runs(client: Remote, as_json: bool, fork_id: str, after: int, limit: int) -> None:
    """Each run of the fork: its input, how it ended (and how the live one did), its ops."""
    page = client.fork_show(fork_id, "runs", {"after": after, "limit": limit})

    def human(page: dict[str, Any]) -> str:
        text = table(page["runs"], RUN_COLUMNS, "(no runs)")
        if page["next_after"] is not None:
            text += f"\n(more: --after {page['next_after']})"
        return text

    emit(page, as_json, human)


@forks.command("state")
@argument("fork_id", FORK_ID_HELP)
@http_command
def forks_state(client: Remote, as_json: bool, fork_id: str) -> None:
    """The fork's ctx.state document."""
    state = client.fork_show(fork_id, "state")
    emit(state, as_json, lambda s: f"version {s['version']}  {compact(s['value'])}")


@forks.command("sql")
@argument("fork_id", FORK_ID_HELP)
@argument("sql", "one read-only statement on the fork's database, like 'SELECT * FROM items'")
@click.option("--params", "params_json", default=None, metavar="JSON", help="Values for its ? marks, a JSON list.")
@click.option("--max-rows", default=None, type=click.IntRange(1, 10000), metavar="N", help="At most N rows.")
@http_command
def forks_sql(client: Remote, as_json: bool, fork_id: str, sql: str, params_json: str | None,
              max_rows: int | None) -> None:
    """A read-only SQL query on the fork's SQLite database."""
    emit(client.fork_sql(fork_id, sql, sql_params(params_json), max_rows), as_json, sql_lines)


@forks.command("diff")
@argument("fork_id", FORK_ID_HELP)
@click.option("--against", default=None, metavar="FORK", help="Another fork of the same instance (default: live).")
@click.option("--exit-code", is_flag=True, help="Exit 1 when something differs.")
@http_command
def forks_diff(client: Remote, as_json: bool, fork_id: str, against: str | None, exit_code: bool) -> None:
    """The fork against its live instance (or another fork): state, tables,
    and per input the effects and how runs ended."""
    d = client.fork_show(fork_id, "diff", {"against": against})
    emit(d, as_json, diff_lines)
    if exit_code and d["changed"]:
        raise SystemExit(1)


@forks.command("discard")
@argument("fork_id", FORK_ID_HELP)
@http_command
def forks_discard(client: Remote, as_json: bool, fork_id: str) -> None:
    """Discard the fork (it would expire by itself)."""
    gone = client.discard_fork(fork_id)
    emit(gone, as_json, lambda f: f"discarded {f['fork_id']}")
