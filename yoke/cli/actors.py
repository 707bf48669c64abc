"""Actor commands over HTTP: ``instances list|create|show|remove|schedules|inputs|sql``
and ``dlq list|redrive|drop`` (docs/basics/actors.md)."""

from __future__ import annotations

from typing import Any

import click

from .common import (
    Column,
    Remote,
    argument,
    compact,
    emit,
    fail,
    group,
    http_command,
    or_dash,
    parse_json,
    table,
    when,
)

INSTANCE_ID_HELP = "an instance: its id, or ACTOR/KEY like order/A-1 (see `yoke instances list`)"


def instance_id_of(client: Remote, ref: str) -> str:
    """An instance id, or ACTOR/KEY looked up on the server."""
    if ref.startswith("inst_") or "/" not in ref:
        return ref
    actor, key = ref.split("/", 1)
    found = client.instances(actor, key=key)["instances"]
    if not found:
        fail(f"no {actor} instance with key {key!r} in {client.tenant_label()};"
             f" `yoke instances list --actor {actor}` lists them")
    return found[0]["id"]

INSTANCE_COLUMNS: list[Column] = [
    ("ID", lambda i: i["id"], "<"),
    ("ACTOR", lambda i: i["actor"], "<"),
    ("KEY", lambda i: i["key"], "<"),
    ("WORKER", lambda i: or_dash(i.get("worker_id")), "<"),
    ("CREATED", lambda i: when(i.get("created_at")), "<"),
]


def instance_lines(i: dict[str, Any]) -> str:
    rows = [
        ("id", i["id"]),
        ("actor", i["actor"]),
        ("key", i["key"]),
        ("created", when(i.get("created_at"))),
        ("config", compact(i["config"])),
        ("filter", compact(i["filter"]) if i["filter"] is not None else "(routed by key)"),
        ("parent", or_dash(i["parent_id"])),
        ("worker", or_dash(i.get("worker_id"))),
    ]
    if "state" in i:
        state, q = i["state"], i["queue"]
        rows += [
            ("state", f"version {state['version']}  {compact(state['value'])}"),
            ("queue", f"{q['pending']} pending, {q['processing']} processing, {q['dead']} dead"),
        ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def first_line(text: str | None, width: int = 80) -> str:
    return (text or "").splitlines()[0][:width] if text else "-"


QUEUE_COLUMNS: list[Column] = [
    ("QID", lambda r: r["qid"], ">"),
    ("ATTEMPTS", lambda r: r["attempts"], ">"),
    ("EVENT", lambda r: f"{r['path']}@{r['offset']}" if r["path"] is not None else "(sent)", "<"),
    ("TYPE", lambda r: (r["event"] or {}).get("type", "?"), "<"),
    ("ERROR", lambda r: first_line(r["last_error"]), "<"),
]


@group()
def instances() -> None:
    """List, create and inspect actor instances."""


@instances.command("list")
@click.option("--actor", default=None, metavar="ACTOR", help="Only instances of this actor.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="At most N instances.")
@click.option("--after", default=None, metavar="ID", help="Continue after this instance id (paging).")
@http_command
def instances_list(client: Remote, as_json: bool, actor: str | None, limit: int, after: str | None) -> None:
    """List actor instances, by id."""
    listed = client.instances(actor, limit, after)["instances"]
    emit(listed, as_json, lambda v: table(v, INSTANCE_COLUMNS, f"(no instances in {client.tenant_label()})"))


@instances.command("create")
@argument("actor", "the name of an actor of the running app, like order")
@click.option("--key", default=None, metavar="KEY", help="The instance key (default: a new one).")
@click.option("--config", "config_json", default=None, metavar="JSON", help="Its config, a JSON object.")
@click.option("--filter", "filter_json", default=None, metavar="JSON",
              help='Events it receives, JSON: {"types": [...], "streams": [...], "where": "..."}.')
@http_command
def instances_create(
    client: Remote, as_json: bool, actor: str, key: str | None, config_json: str | None, filter_json: str | None
) -> None:
    """Create the instance (ACTOR, --key), or show the existing one."""
    config = parse_json(config_json, "--config") if config_json is not None else None
    filter_ = parse_json(filter_json, "--filter") if filter_json is not None else None
    created = client.create_instance(actor, key, config, filter_)
    emit(
        created,
        as_json,
        lambda i: f"{'created' if i['created'] else 'exists '} {i['id']} (actor {i['actor']}, key {i['key']})",
    )


@instances.command("show")
@argument("instance_id", INSTANCE_ID_HELP)
@http_command
def instances_show(client: Remote, as_json: bool, instance_id: str) -> None:
    """An instance, its state and its queue depth."""
    emit(client.instance(instance_id_of(client, instance_id)), as_json, instance_lines)


@instances.command("remove")
@argument("instance_id", INSTANCE_ID_HELP)
@http_command
def instances_remove(client: Remote, as_json: bool, instance_id: str) -> None:
    """Remove an instance with its queue rows, schedules and state."""
    removed = client.remove_instance(instance_id_of(client, instance_id))
    emit(removed, as_json, lambda i: f"removed {i['id']} (actor {i['actor']}, key {i['key']})")


SCHEDULE_COLUMNS: list[Column] = [
    ("NAME", lambda s: s["name"], "<"),
    ("DUE", lambda s: when(s["due_at"]), "<"),
    ("CRON", lambda s: or_dash(s["cron"]), "<"),
    ("STREAM", lambda s: or_dash(s["stream"]), "<"),
    ("EVENT", lambda s: compact(s["event"]), "<"),
]


@instances.command("schedules")
@argument("instance_id", INSTANCE_ID_HELP)
@http_command
def instances_schedules(client: Remote, as_json: bool, instance_id: str) -> None:
    """The instance's timers and cron schedules (ctx.schedules), by name."""
    listed = client.schedules(instance_id_of(client, instance_id))["schedules"]
    emit(listed, as_json, lambda v: table(v, SCHEDULE_COLUMNS, "(no schedules)"))


INPUT_COLUMNS: list[Column] = [
    ("SEQ", lambda r: r["seq"], ">"),
    ("KIND", lambda r: r["kind"], "<"),
    ("EVENT", lambda r: f"{r['path']}@{r['offset']}" if r["path"] is not None else "(sent)", "<"),
    ("TYPE", lambda r: (r["event"] or {}).get("type", "?"), "<"),
    ("OUTCOME", lambda r: r["outcome"] if r["outcome"] == "done" else f"dead: {first_line(r['error'], 60)}", "<"),
    ("ATTEMPTS", lambda r: r["attempts"], ">"),
    ("OPS", lambda r: len(r["ops"]), ">"),
    ("PROCESSED", lambda r: when(r["processed_at"]), "<"),
    ("CODE", lambda r: or_dash(r["code_version"]), "<"),
]


@instances.command("inputs")
@argument("instance_id", INSTANCE_ID_HELP)
@click.option("--after", default=0, show_default=True, type=click.IntRange(0), metavar="SEQ",
              help="Inputs after this number (paging).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="At most N inputs.")
@http_command
def instances_inputs(client: Remote, as_json: bool, instance_id: str, after: int, limit: int) -> None:
    """The inputs the instance processed, in order: each event, message or
    schedule firing, how its run ended, and what it did outside its state."""
    page = client.inputs(instance_id_of(client, instance_id), after, limit)

    def human(page: dict[str, Any]) -> str:
        text = table(page["inputs"], INPUT_COLUMNS, "(no inputs kept)")
        if page["next_after"] is not None:
            text += f"\n(more: --after {page['next_after']})"
        return text

    emit(page, as_json, human)


@instances.command("sql")
@argument("instance_id", INSTANCE_ID_HELP)
@argument("sql", "one read-only statement, like 'SELECT * FROM items' (ctx.sqlite tables and _yoke_state)")
@click.option("--params", "params_json", default=None, metavar="JSON", help="Values for its ? marks, a JSON list.")
@click.option("--max-rows", default=None, type=click.IntRange(1, 10000), metavar="N",
              help="At most N rows (default 500).")
@http_command
def instances_sql(client: Remote, as_json: bool, instance_id: str, sql: str, params_json: str | None,
                  max_rows: int | None) -> None:
    """A read-only SQL query on the instance's own SQLite database."""
    emit(client.instance_sql(instance_id_of(client, instance_id), sql, sql_params(params_json), max_rows), as_json,
         sql_lines)


def sql_params(params_json: str | None) -> list[Any] | None:
    """--params: a JSON list, or None."""
    params = parse_json(params_json, "--params") if params_json is not None else None
    if params is not None and not isinstance(params, list):
        fail("--params is a JSON list, like '[\"a\", 2]'")
    return params


def sql_cell(value: Any) -> str:
    """Text as it is, NULL for null, numbers as written."""
    if value is None:
        return "NULL"
    return value if isinstance(value, str) else compact(value)


def sql_lines(result: dict[str, Any]) -> str:
    """The rows under their column names; a last line when the rows were cut."""
    rows = [{str(i): v for i, v in enumerate(row)} for row in result["rows"]]
    columns: list[Column] = [
        (name, lambda r, i=i: sql_cell(r[str(i)]), "<")
        for i, name in enumerate(result["columns"])
    ]
    text = table(rows, columns, "(no rows)") if columns else "(no rows)"
    if result.get("truncated"):
        text += f"\n(the first {len(rows)} rows: --max-rows for more)"
    return text


@group()
def dlq() -> None:
    """Dead-lettered queue rows of an instance: list, redrive, drop."""


@dlq.command("list")
@argument("instance_id", INSTANCE_ID_HELP)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), metavar="N",
              help="At most N rows.")
@http_command
def dlq_list(client: Remote, as_json: bool, instance_id: str, limit: int) -> None:
    """The dead rows of an instance, with their last error."""
    rows = client.dead_letters(instance_id_of(client, instance_id), limit)["rows"]
    emit(rows, as_json, lambda v: table(v, QUEUE_COLUMNS, "(no dead rows)"))


QID_OPTION = click.option(
    "--qid", "qids", multiple=True, type=int, metavar="QID",
    help="A dead row's qid (repeatable; default: all dead rows).",
)


@dlq.command("redrive")
@argument("instance_id", INSTANCE_ID_HELP)
@QID_OPTION
@http_command
def dlq_redrive(client: Remote, as_json: bool, instance_id: str, qids: tuple[int, ...]) -> None:
    """Dead rows back to pending, attempts reset."""
    result = client.redrive(instance_id_of(client, instance_id), list(qids) or None)
    emit(result, as_json, lambda r: f"redriven {r['redriven']} row(s) of {instance_id}")


@dlq.command("drop")
@argument("instance_id", INSTANCE_ID_HELP)
@QID_OPTION
@http_command
def dlq_drop(client: Remote, as_json: bool, instance_id: str, qids: tuple[int, ...]) -> None:
    """Delete dead rows."""
    result = client.drop_dead(instance_id_of(client, instance_id), list(qids) or None)
    emit(result, as_json, lambda r: f"dropped {r['dropped']} row(s) of {instance_id}")
