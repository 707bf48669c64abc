"""``yoke subscriptions list|show|add|remove|pause|halt|resume|cursor|wait`` over HTTP
(docs/basics/subscriptions.md)."""

from __future__ import annotations

from typing import Any

import click

from .common import Column, Remote, argument, compact, emit, fail, group, http_command, table, when

SOURCE_HELP = "the source stream's path, like /orders"
NAME_HELP = "the subscription's name (see `yoke subscriptions list PATH`)"


def receiver_text(config: dict[str, Any]) -> str:
    kind = config.get("kind")
    if kind == "copy":
        return f"copy to {config['target']}"
    if kind == "call":
        return f"call {config['function']}"
    if kind == "processor":
        return f"processor {config['processor']}"
    return f"webhook {config.get('url')}"


def subscription_state(s: dict[str, Any]) -> str:
    if s.get("parked") is not None:
        return f"parked at {s['parked'].get('offset')}"
    if s["halted"] is not None:
        return f"halted at {s['halted'].get('offset')}"
    if s["next_retry_at"] is not None:
        return f"retrying (attempt {s['attempts'] + 1})"
    return "running"


SUBSCRIPTION_COLUMNS: list[Column] = [
    ("NAME", lambda s: s["name"], "<"),
    ("RECEIVER", lambda s: receiver_text(s["config"]), "<"),
    ("THROUGH", lambda s: s["processed_through_offset"], ">"),
    ("LAG", lambda s: s["lag"], ">"),
    ("STATE", subscription_state, "<"),
    # Kept after it recovers: a running subscription that failed lately says when.
    ("LAST ERROR AT", lambda s: when(s.get("last_error_at")), "<"),
]


def last_error_line(s: dict[str, Any]) -> str:
    """``(at 2025-06-01 12:00:05): ValueError: ...`` (the time when the server knows it)."""
    text = s["last_error"].splitlines()[0][:200]
    at = s.get("last_error_at")
    return text if at is None else f"(at {when(at)}): {text}"


def subscription_lines(s: dict[str, Any]) -> str:
    c = s["config"]
    rows = [
        ("name", f"{s['name']}   on {s['path']}"),
        ("receiver", receiver_text(c)),
        ("filter", compact(c["filter"]) if c.get("filter") else "(every event)"),
        ("transform", c.get("transform") or "-"),
        ("start", f"{c.get('start')}   on failing event: {c.get('on_failing_event')}"),
        ("configured", f"at offset {s['configured_at']}   generation {s['generation']}"),
        ("cursor", f"processed through {s['processed_through_offset']}   head {s['head']}   lag {s['lag']}"),
        ("state", f"{subscription_state(s)}   {s['delivered']} delivered, {s['failures']} failures"),
    ]
    if s["halted"] is not None:
        rows.append(("halted", compact(s["halted"])))
    if s["last_error"]:
        rows.append(("last error", last_error_line(s)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@group(short_help="Subscriptions of a stream: list, show, add, remove, pause, halt, resume, cursor, wait.")
def subscriptions() -> None:
    """Subscriptions of a source stream: list, show, add, remove, pause,
    halt, resume, cursor, wait."""


@subscriptions.command("list")
@argument("path", SOURCE_HELP)
@http_command
def subscriptions_list(client: Remote, as_json: bool, path: str) -> None:
    """The subscriptions of the stream PATH, with cursor, lag and state."""
    listed = client.subscriptions(path)["subscriptions"]
    emit(listed, as_json, lambda v: table(v, SUBSCRIPTION_COLUMNS, f"(no subscriptions on {path})"))


@subscriptions.command("show", short_help="One subscription: configuration, cursor, lag, errors.")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@http_command
def subscriptions_show(client: Remote, as_json: bool, path: str, name: str) -> None:
    """Configuration, cursor, lag, halt and last error of one subscription."""
    emit(client.subscription(path, name), as_json, subscription_lines)


@subscriptions.command("add", short_help="Configure a subscription with one receiver.")
@argument("path", SOURCE_HELP)
@click.option("--name", default=None, metavar="NAME", help="The subscription's name (default: generated).")
@click.option("--copy-to", "copy_to", default=None, metavar="PATH", help="Receiver: append copies to this stream.")
@click.option("--call", "call_name", default=None, metavar="NAME", help="Receiver: the app's @app.receiver(NAME).")
@click.option("--processor", default=None, metavar="NAME", help="Receiver: the app's @app.processor(NAME).")
@click.option("--webhook", default=None, metavar="URL", help="Receiver: POST each event to this http(s) URL.")
@click.option("--secret", default=None, metavar="SECRET",
              help="The webhook's whsec_ secret (default: generated, printed once).")
@click.option("--types", default=None, metavar="T,...",
              help="Only these event types, comma-separated: exact, prefix.* or *.")
@click.option("--where", default=None, metavar="JSONATA", help="Only events for which this JSONata is true.")
@click.option("--transform", default=None, metavar="JSONATA",
              help="JSONata reshaping each event into {type?, payload?, metadata?}.")
@click.option("--start", type=click.Choice(["now", "beginning"]), default=None,
              help="Deliver events appended from now on (default) or from the beginning.")
@click.option("--on-failing-event", type=click.Choice(["halt", "skip"]), default=None,
              help="After the last retry: halt (default) or skip the event.")
@http_command
def subscriptions_add(
    client: Remote, as_json: bool, path: str, name: str | None, copy_to: str | None, call_name: str | None,
    processor: str | None, webhook: str | None, secret: str | None, types: str | None, where: str | None,
    transform: str | None, start: str | None, on_failing_event: str | None,
) -> None:
    """Configure a subscription of PATH with one receiver (the same
    configuration again changes nothing)."""
    if sum(value is not None for value in (copy_to, call_name, processor, webhook)) != 1:
        fail("give exactly one receiver: --copy-to PATH, --call NAME, --processor NAME or --webhook URL")
    if secret is not None and webhook is None:
        fail("--secret goes with --webhook")
    receiver: dict[str, Any]
    if copy_to is not None:
        receiver = {"kind": "copy", "target": copy_to}
    elif call_name is not None:
        receiver = {"kind": "call", "function": call_name}
    elif processor is not None:
        receiver = {"kind": "processor", "processor": processor}
    else:
        receiver = {"kind": "webhook", "url": webhook}
        if secret is not None:
            receiver["secret"] = secret
    event_filter: dict[str, Any] | None = None
    if types is not None or where is not None:
        event_filter = {"types": [t.strip() for t in (types or "*").split(",")]}
        if where is not None:
            event_filter["where"] = where
    result = client.subscribe(
        path, receiver, name=name, filter=event_filter, transform=transform, start=start,
        on_failing_event=on_failing_event,
    )

    def human(r: dict[str, Any]) -> str:
        verb = "replaced" if r.get("replaced") else "created" if r["created"] else "exists "
        line = f"{verb} {r['name']} on {r['path']} (configured at offset {r['offset']})"
        if r["secret"]:
            line += f"\nwebhook secret (shown once): {r['secret']}"
        return line

    emit(result, as_json, human)


@subscriptions.command("remove", short_help="Remove a subscription.")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@http_command
def subscriptions_remove(client: Remote, as_json: bool, path: str, name: str) -> None:
    """Remove a subscription (its configuration stays in the stream's log)."""
    client.unsubscribe(path, name)
    emit({"removed": name, "path": path}, as_json, lambda r: f"removed {name} from {path}")


@subscriptions.command("pause", short_help="Park a subscription: delivery stops, the cursor stays.")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@http_command
def subscriptions_pause(client: Remote, as_json: bool, path: str, name: str) -> None:
    """Pause a subscription (a paused event on PATH): nothing is delivered,
    the cursor stays, its state is parked; `resume` continues where it stopped."""
    status = client.pause_subscription(path, name)
    emit(status, as_json, lambda s: f"{s['name']}: {subscription_state(s)}, processed through "
         f"{s['processed_through_offset']} (lag {s['lag']})")


@subscriptions.command("halt", short_help="Halt a subscription by command (only resume restarts it).")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@http_command
def subscriptions_halt(client: Remote, as_json: bool, path: str, name: str) -> None:
    """Halt a subscription (a halted event on PATH, reason operator): only
    `resume` or `cursor --resume` start it again, never a new deployment."""
    status = client.halt_subscription(path, name)
    emit(status, as_json, lambda s: f"{s['name']}: {subscription_state(s)}, processed through "
         f"{s['processed_through_offset']} (lag {s['lag']})")


@subscriptions.command("resume")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@http_command
def subscriptions_resume(client: Remote, as_json: bool, path: str, name: str) -> None:
    """Resume a halted or parked subscription where it stopped."""
    status = client.resume_subscription(path, name)
    emit(status, as_json, lambda s: f"{s['name']}: {subscription_state(s)}, processed through "
         f"{s['processed_through_offset']} (lag {s['lag']})")


@subscriptions.command("cursor", short_help="Deliver again (or skip ahead) from an offset.")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@argument("after_offset", "the offset after which delivery starts again, like 0 (from the beginning)",
          type=int)
@click.option("--resume", is_flag=True, help="Also resume it if halted.")
@http_command
def subscriptions_cursor(client: Remote, as_json: bool, path: str, name: str, after_offset: int,
                         resume: bool) -> None:
    """Deliver again (or skip ahead) from AFTER_OFFSET + 1: a new delivery run."""
    status = client.set_subscription_cursor(path, name, after_offset, resume)
    emit(status, as_json, lambda s: f"{s['name']}: cursor after {s['processed_through_offset']}"
         f" (generation {s['generation']}), {subscription_state(s)}")


@subscriptions.command("wait", short_help="Wait until a subscription processed an offset.")
@argument("path", SOURCE_HELP)
@argument("name", NAME_HELP)
@argument("offset", "the offset to wait for (default: the stream's head)", type=int, required=False)
@click.option("--timeout", "timeout_s", type=float, default=20.0, show_default=True, metavar="SECONDS",
              help="Give up after this long (at most 60).")
@http_command
def subscriptions_wait(
    client: Remote, as_json: bool, path: str, name: str, offset: int | None, timeout_s: float
) -> None:
    """Wait until NAME processed through OFFSET (default: the stream's head);
    exits 1 with not_processed after --timeout."""
    status = client.wait_subscription(path, name, offset, timeout_s)
    emit(status, as_json, lambda s: f"{s['name']}: processed through {s['processed_through_offset']}"
         f" (head {s['head']})")

