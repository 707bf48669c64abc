"""``yoke failures list|show|replay|discard`` over HTTP: the failures inbox
(docs/advanced/failures.md). ``replay`` and ``discard`` act on one failure (its id)
or, with ``--all``, on every failure the filter options select."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from datetime import datetime
from typing import Any

import click

from .common import Column, Remote, argument, compact, emit, fail, group, http_command, or_dash, parse_json, table, when

ID_HELP = "a failure id, like dl_WzE3XQ (see `yoke failures list`)"
AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def moment(value: str | None, option: str) -> int | None:
    """ms since the epoch from ms, a time ago (``90s``, ``10m``, ``2h``,
    ``7d``) or an ISO 8601 time (local unless it says its zone), inside the
    range the server takes (0 to 2^63-1): anything else is a message, not a
    traceback or a refusal from the server."""
    from ..events import DIGITS_RE, MAX_INT  # here: the CLI imports no core module to start

    if value is None:
        return None
    ms = None
    ago = re.fullmatch(r"([0-9]+)([smhd])", value)
    if DIGITS_RE.fullmatch(value):  # ASCII digits, few enough for int()
        ms = int(value)
    elif ago and DIGITS_RE.fullmatch(ago.group(1)):  # in integers: no float overflow
        ms = time.time_ns() // 1_000_000 - int(ago.group(1)) * AGO[ago.group(2)] * 1000
    elif not ago:
        try:
            ms = int(datetime.fromisoformat(value).timestamp() * 1000)
        except (ValueError, OverflowError, OSError):
            pass
    if ms is None or not 0 <= ms <= MAX_INT:
        fail(f"{option} takes ms since the epoch (0 to {MAX_INT}), a time ago like 10m, 2h or 7d, or an ISO"
             f" time like 2026-12-01T09:00 (not before 1970); not {value[:80]!r}")
    return ms


def filter_options(fn: Any) -> Any:
    options = [
        click.option("--kind", type=click.Choice(["dead_letter", "halted", "skipped"]), default=None,
                     help="Only failures of this kind."),
        click.option("--receiver", type=click.Choice(["actor", "copy", "webhook", "call", "processor"]),
                     default=None, help="Only failures bound for this kind of receiver."),
        click.option("--stream", default=None, metavar="PATH", help="Only events of this stream."),
        click.option("--actor", default=None, metavar="ACTOR", help="Only dead letters of this actor."),
        click.option("--instance", "instance_id", default=None, metavar="ID",
                     help="Only dead letters of this instance."),
        click.option("--subscription", default=None, metavar="NAME",
                     help="Only failures of the subscription with this name."),
        click.option("--since", default=None, metavar="TIME",
                     help="Failed at or after TIME: ms, a time ago (10m, 2h, 7d) or an ISO time."),
        click.option("--until", default=None, metavar="TIME", help="Failed before TIME (as --since)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def selection(kind: str | None, receiver: str | None, stream: str | None, actor: str | None,
              instance_id: str | None, subscription: str | None, since: str | None,
              until: str | None) -> dict[str, Any]:
    chosen = {
        "kind": kind, "receiver": receiver, "stream": stream, "actor": actor, "instance_id": instance_id,
        "subscription": subscription, "since": moment(since, "--since"), "until": moment(until, "--until"),
    }
    return {k: v for k, v in chosen.items() if v is not None}


def where(f: dict[str, Any]) -> str:
    if f["kind"] == "dead_letter":
        return f"{f['actor'] or '?'} {f['instance_id']}"
    return f"{f['receiver']} {f['subscription']}"


FAILURE_COLUMNS: list[Column] = [
    ("ID", lambda f: f["id"], "<"),
    ("KIND", lambda f: f["kind"], "<"),
    ("EVENT", lambda f: f"{f['path']}@{f['offset']}" if f["path"] is not None else "(sent)", "<"),
    ("TO", where, "<"),
    ("FAILED", lambda f: when(f["failed_at"]), "<"),
    ("ATTEMPTS", lambda f: f["attempt_count"], ">"),
    ("ERROR", lambda f: error_cell(f["error"]), "<"),
]

ERROR_CELL_CHARS = 100  # the list's last column; `yoke failures show ID` prints the whole error


def error_cell(error: str | None) -> str:
    """An error on one line, cut at a word (marked …) rather than mid-word."""
    if not error:
        return "-"
    flat = " ".join(error.split())
    if len(flat) <= ERROR_CELL_CHARS:
        return flat
    cut = textwrap.shorten(flat, ERROR_CELL_CHARS, placeholder=" …")
    # A word longer than the cell (a JSON blob, a URL) would leave almost
    # nothing: then cut inside it.
    return cut if len(cut) >= ERROR_CELL_CHARS // 2 else flat[: ERROR_CELL_CHARS - 2] + " …"


def failure_lines(f: dict[str, Any]) -> str:
    rows = [
        ("id", f["id"]),
        ("kind", f"{f['kind']}   receiver {f['receiver']}"),
        ("event", f"{f['path']}@{f['offset']}" if f["path"] is not None else "(sent to the instance)"),
        ("to", where(f)),
        ("failed", f"{when(f['failed_at'])}   after {f['attempt_count']} attempt(s)"),
        ("error", or_dash(f["error"])),
    ]
    for a in f["attempts"]:
        rows.append((f"attempt {a['number']}", f"{when(a['at'])}  {or_dash(a['error'])}"))
    rows.append(("content", compact(f["event"]) if f["event"] is not None else "(removed by retention)"))
    width = max(len(name) for name, _ in rows)
    text = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    if f.get("traceback"):
        text += "\n\n" + f["traceback"].rstrip()
    return text


def resolution_line(r: dict[str, Any]) -> str:
    at = f"{r['audit_path']}@{r['audit_offset']}"
    return f"{r['action']} {r['id']} (audit event {at}{', delivered' if r.get('delivered') else ''})"


OUTCOME_WORDS = {"done": "done", "failed": "failed again", "pending": "still pending"}


def waited_lines(r: dict[str, Any]) -> str:
    """A replay and what became of its event (``--wait``)."""
    o = r["outcome"]
    lines = [resolution_line(r), f"{OUTCOME_WORDS.get(o['state'], o['state'])}: {o['detail']}"]
    if o.get("error"):
        at = f" (at {when(o['error_at'])})" if o.get("error_at") is not None else ""
        lines.append(f"{'error' if o['state'] == 'failed' else 'last error'}{at}: {o['error']}")
    return "\n".join(lines)


def bulk_lines(b: dict[str, Any]) -> str:
    lines = [resolution_line(r) for r in b["done"]]
    lines += [f"failed   {x['id']}: {x['error'].get('code')}: {x['error'].get('message')}" for x in b["failed"]]
    lines.append(f"{len(b['done'])} done, {len(b['failed'])} failed")
    return "\n".join(lines)


def emit_bulk(b: dict[str, Any], as_json: bool) -> None:
    """Print what a bulk action did; exit 1 when any failure could not be
    resolved (scripts see a partial run)."""
    emit(b, as_json, bulk_lines)
    if b["failed"]:
        sys.exit(1)


def one_or_all(failure_id: str | None, every: bool, chosen: dict[str, Any]) -> None:
    if failure_id is not None and (every or chosen):
        fail("give a failure id, or --all with filter options, not both")
    if failure_id is None and not every:
        fail("give a failure id (see `yoke failures list`), or --all to act on every failure the"
             " filter options select")


@group()
def failures() -> None:
    """The failures inbox: dead letters, halted subscriptions, skipped events."""


@failures.command("list")
@filter_options
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="At most N failures.")
@http_command
def failures_list(client: Remote, as_json: bool, limit: int, **filters: Any) -> None:
    """Open failures, oldest first."""
    listed = client.failures(limit, **selection(**filters))["failures"]
    emit(listed, as_json, lambda v: table(v, FAILURE_COLUMNS, f"(no failures in {client.tenant_label()})"))


@failures.command("show")
@argument("failure_id", ID_HELP)
@http_command
def failures_show(client: Remote, as_json: bool, failure_id: str) -> None:
    """One failure: its event, attempts and errors."""
    emit(client.failure(failure_id), as_json, failure_lines)


@failures.command("replay")
@argument("failure_id", ID_HELP, required=False)
@click.option("--patch", "patch_json", default=None, metavar="JSON",
              help='A JSON Merge Patch of the event: {"payload": {"amount": 12}} changes that field, keeps the'
                   ' rest; null removes one.')
@click.option("--event", "event_json", default=None, metavar="JSON",
              help='Fields replaced whole: {"type", "payload", "metadata"}, each optional (default: as it was).')
@click.option("--all", "every", is_flag=True, help="Replay every failure the filter options select.")
@filter_options
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="With --all: at most N failures, oldest first.")
@click.option("--wait", is_flag=True,
              help="Then wait for the outcome: exit 0 once the event went through, 1 when it failed again (the"
                   " error printed) or had not settled by --timeout. One failure id, not --all.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, 60), default=None, metavar="SECONDS",
              help="With --wait: how long to wait (default 30, at most 60).")
@http_command
def failures_replay(client: Remote, as_json: bool, failure_id: str | None, patch_json: str | None,
                    event_json: str | None, every: bool, limit: int, wait: bool, timeout_s: float | None,
                    **filters: Any) -> None:
    """Replay a failure (or --all), as it was or corrected (--patch, or
    --event to replace fields whole); with --all, exit 1 when any could not
    be replayed. --wait: then wait for the replayed event to go through (a
    dead letter processed, a subscription past it) or to fail again; exit 1
    unless it went through."""
    chosen = selection(**filters)
    one_or_all(failure_id, every, chosen)
    if patch_json is not None and event_json is not None:
        raise click.UsageError("give --patch or --event, not both")
    if wait and failure_id is None:
        raise click.UsageError("--wait waits for one failure id, not --all")
    if timeout_s is not None and not wait:
        raise click.UsageError("--timeout goes with --wait")
    patch = parse_json(patch_json, "--patch") if patch_json is not None else None
    event = parse_json(event_json, "--event") if event_json is not None else None
    if failure_id is not None and wait:
        timeout = 30.0 if timeout_s is None else timeout_s
        done = client.replay_failure(failure_id, event, patch, wait=True, timeout_s=timeout)
        emit(done, as_json, waited_lines)
        if done["outcome"]["state"] != "done":
            sys.exit(1)
        return
    if failure_id is not None:
        emit(client.replay_failure(failure_id, event, patch), as_json, resolution_line)
        return
    emit_bulk(client.replay_failures(chosen, event, limit, patch), as_json)


@failures.command("discard")
@argument("failure_id", ID_HELP, required=False)
@click.option("--reason", required=True, metavar="TEXT", help="Why (kept in the audit event).")
@click.option("--all", "every", is_flag=True, help="Discard every failure the filter options select.")
@filter_options
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="With --all: at most N failures, oldest first.")
@http_command
def failures_discard(client: Remote, as_json: bool, failure_id: str | None, reason: str, every: bool, limit: int,
                     **filters: Any) -> None:
    """Discard a failure (or --all), with a reason; with --all, exit 1 when
    any could not be discarded."""
    chosen = selection(**filters)
    one_or_all(failure_id, every, chosen)
    if failure_id is not None:
        emit(client.discard_failure(failure_id, reason), as_json, resolution_line)
        return
    emit_bulk(client.discard_failures(chosen, reason, limit), as_json)
