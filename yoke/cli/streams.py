"""Stream commands over HTTP: ``append``, ``read``, ``tail``, ``streams`` and
``stream info|close|delete|retention|hold``."""

from __future__ import annotations

import sys
from typing import Any

import click

from .common import (
    Column,
    PATH_HELP,
    Remote,
    argument,
    command,
    compact,
    emit,
    fail,
    group,
    http_command,
    parse_json,
    table,
    table_line,
    when,
    yes_no,
)

EVENT_COLUMNS: list[Column] = [
    ("OFFSET", lambda e: e["offset"], ">"),
    ("AT", lambda e: when(e.get("at")), "<"),
    ("TYPE", lambda e: e["type"], "<"),
    ("PAYLOAD", lambda e: compact(e["payload"]) + (" (ephemeral)" if e.get("ephemeral") else ""), "<"),
]
EVENT_WIDTHS = (6, 19, 20)  # tail prints as events come: fixed minimum widths


def event_line(event: dict[str, Any]) -> str:
    """One event as a row of the events table (without its header)."""
    return table_line([str(get(event)) for _, get, _ in EVENT_COLUMNS], EVENT_WIDTHS + (0,), EVENT_COLUMNS)


def events_header() -> str:
    return table_line([name for name, _, _ in EVENT_COLUMNS], EVENT_WIDTHS + (0,), EVENT_COLUMNS)


def retention_text(retention: dict[str, Any]) -> str:
    def limit(value: Any) -> str:
        return "unlimited" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    return f"max_age_s={limit(retention['max_age_s'])}  max_events={limit(retention['max_events'])}"


def info_lines(info: dict[str, Any]) -> str:
    usage = info["usage"]
    limits = {k: v for k, v in (info.get("limits") or {}).items() if v is not None}
    rows = [
        ("path", info["path"]),
        ("tenant", info.get("tenant", "-")),
        ("stream id", info["stream_id"]),
        ("created", when(info.get("created_at"))),
        ("head", f"{info['head']}   (earliest readable: {info['earliest']})"),
        ("closed", yes_no(info["closed"])),
        ("legal hold", yes_no(info["legal_hold"])),
        ("pinned", yes_no(info.get("pinned"))),
        ("retention", retention_text(info["retention"])),
        ("limits", "  ".join(f"{k}={v}" for k, v in limits.items()) or "none"),
        ("usage", f"{usage['durable_events']} events, {usage['durable_bytes']} bytes"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


STREAM_COLUMNS: list[Column] = [
    ("PATH", lambda s: s["path"], "<"),
    ("HEAD", lambda s: s["head"], ">"),
    ("EVENTS", lambda s: s["usage"]["durable_events"], ">"),
    ("BYTES", lambda s: s["usage"]["durable_bytes"], ">"),
    ("CLOSED", lambda s: yes_no(s["closed"]), "<"),
    ("CREATED", lambda s: when(s.get("created_at")), "<"),
]


@command()
@argument("path", PATH_HELP)
@argument("type_", "the event type, like order.placed")
@argument("payload", "the payload as JSON, like '{\"id\": 7}' (default {})", required=False, default=None)
@click.option("--idempotency-key", default=None, metavar="KEY",
              help="Append only once: the same key and event again returns the original offset.")
@http_command
def append(client: Remote, as_json: bool, path: str, type_: str, payload: str | None,
           idempotency_key: str | None) -> None:
    """Append one event: yoke append /orders order.placed '{"id": 7}'"""
    event: dict[str, Any] = {"type": type_}
    if payload is not None:
        event["payload"] = parse_json(payload, "PAYLOAD")
    if idempotency_key:
        event["idempotency_key"] = idempotency_key
    result = client.append(path, event)
    emit(result, as_json, lambda r: f"appended {path} offset {r['offset']} id {r['id']}")


def check_exists(client: Remote, path: str) -> None:
    """Raise the server's stream_not_found if ``path`` does not exist (a
    read of a missing stream may answer an empty page)."""
    client.info(path)


@command()
@argument("path", PATH_HELP)
@click.option("--after", default=0, show_default=True, type=int, metavar="OFFSET",
              help="Read events with offset > OFFSET.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000), metavar="N",
              help="At most N events.")
@http_command
def read(client: Remote, as_json: bool, path: str, after: int, limit: int) -> None:
    """Read events with offset > --after. A stream that does not exist is an
    error (exit status 1), not an empty page."""
    page = client.read(path, after, limit)
    if not page["events"]:
        check_exists(client, path)
    emit(page, as_json, lambda p: table(p["events"], EVENT_COLUMNS, f"(no events after offset {after})",
                                        EVENT_WIDTHS))


@command(short_help="Print the events after --after, then follow new ones live.")
@argument("path", PATH_HELP)
@click.option("--after", default=0, show_default=True, type=int, metavar="OFFSET",
              help="Start after this offset (0: from the beginning).")
@http_command
def tail(client: Remote, as_json: bool, path: str, after: int) -> None:
    """Print the events after --after, then follow new ones as they are
    appended, until the stream is closed (Ctrl-C to stop). A stream that does
    not exist yet is waited for."""
    if not as_json:
        click.echo(events_header())
    try:
        for event in client.tail(path, after):
            click.echo(compact(event) if as_json else event_line(event))
    except KeyboardInterrupt:
        return


@command()
@argument("prefix", "only paths that start with this, like /orders/ (default: all)", required=False,
          default="/")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 10000), metavar="N",
              help="At most N streams.")
@click.option("--after", default=None, metavar="PATH", help="Continue after this path (paging).")
@http_command
def streams(client: Remote, as_json: bool, prefix: str, limit: int, after: str | None) -> None:
    """List the streams of the tenant, by path."""
    listed = client.streams(prefix, limit, after)["streams"]
    emit(listed, as_json, lambda v: table(v, STREAM_COLUMNS, f"(no streams in {client.tenant_label()})"))


@group()
def stream() -> None:
    """Inspect and change one stream: info, close, delete, retention, hold."""


@stream.command("info")
@argument("path", PATH_HELP)
@http_command
def stream_info(client: Remote, as_json: bool, path: str) -> None:
    """Head, state, retention, limits and usage of a stream."""
    emit(client.info(path), as_json, info_lines)


@stream.command("close", short_help="Close a stream to appends (reads keep working).")
@argument("path", PATH_HELP)
@http_command
def stream_close(client: Remote, as_json: bool, path: str) -> None:
    """Close a stream: appends are refused from now on, reads keep working."""
    emit(client.close_stream(path), as_json, lambda i: f"closed {i['path']} at head {i['head']}")


@stream.command("delete", short_help="Delete a stream and everything kept for it (asks first; --yes).")
@argument("path", PATH_HELP)
@click.option("--yes", "-y", "yes", is_flag=True, help="Delete without asking (needed when not at a terminal).")
@http_command
def stream_delete(client: Remote, as_json: bool, path: str, yes: bool) -> None:
    """Delete the stream PATH: its events, consumers, objects and the
    subscriptions it is the source of, for good. Its open tails end; the
    path can be created again as a new stream (offsets from 1). Refused
    under legal hold, and for the global stream /."""
    if not yes:
        info = client.info(path)
        if not sys.stdin.isatty():
            fail(f"deleting {info['path']} cannot be undone: add --yes to delete it")
        question = (
            f"Delete {info['path']} ({info['usage']['durable_events']} events, head {info['head']},"
            f" stream id {info['stream_id']}) for good?"
        )
        if not click.confirm(question, default=False):
            fail("nothing deleted")
    emit(client.delete_stream(path), as_json,
         lambda i: f"deleted {i['path']} (stream id {i['stream_id']}, head {i['head']})")


@stream.command("retention")
@argument("path", PATH_HELP)
@click.option("--max-age", "max_age_s", type=float, default=None, metavar="SECONDS",
              help="Remove events older than this (omit: unlimited).")
@click.option("--max-events", type=int, default=None, metavar="N", help="Keep the newest N events (omit: unlimited).")
@http_command
def stream_retention(client: Remote, as_json: bool, path: str, max_age_s: float | None,
                     max_events: int | None) -> None:
    """Set how long events are kept (both omitted: forever)."""
    emit(client.set_retention(path, max_age_s, max_events), as_json, info_lines)


@stream.command("hold")
@argument("path", PATH_HELP)
@argument("state", "on or off", type=click.Choice(["on", "off"]))
@http_command
def stream_hold(client: Remote, as_json: bool, path: str, state: str) -> None:
    """Turn the legal hold on (nothing is pruned) or off."""
    emit(client.set_legal_hold(path, state == "on"), as_json, lambda i: f"legal hold {state} for {i['path']}")

