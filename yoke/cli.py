"""The ``yoke`` command line.

Server and operator commands (``serve``, ``worker``, ``migrate``,
``tokens``) work on the database directly. Stream, subscription and actor
commands (``append``, ``read``, ``tail``, ``streams``, ``stream ...``,
``subscriptions ...``, ``instances ...``, ``dlq ...``) talk HTTP to
``--url`` with ``--token`` (default: ``YOKE_TOKEN``, else ``./.yoke/token-PORT``
written by ``yoke serve`` on the port of ``--url``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click
import orjson

from .client import DEFAULT_URL, Client, ClientError, default_token, url_port
from .config import Settings

DB_OPTION = click.option(
    "--db",
    "database_url",
    envvar="YOKE_DATABASE_URL",
    default=None,
    help="Database URL: sqlite:///path.db (default sqlite:///./.yoke/yoke.db) or postgresql://...",
)


@click.group()
def main() -> None:
    """Yoke: durable event streams and actors."""


# --- output helpers ------------------------------------------------------------


def emit(value: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    if as_json:
        click.echo(orjson.dumps(value).decode())
    else:
        click.echo(human(value))


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def http_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --url/--token/--json and turns server errors into one clear line."""

    @click.option("--url", envvar="YOKE_URL", default=DEFAULT_URL, show_default=True, help="Yoke server")
    @click.option("--token", default=None, help="Bearer token (default: $YOKE_TOKEN or ./.yoke/token-PORT)")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
    @wraps(fn)
    def wrapper(url: str, token: str | None, as_json: bool, **kwargs: Any) -> None:
        token = token or default_token(port=url_port(url))
        if not token:
            fail("no token: pass --token, set YOKE_TOKEN, or run `yoke serve` here first")
        try:
            with Client(url, token) as client:
                fn(client, as_json, **kwargs)
        except ClientError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"cannot reach {url}: {exc}")
        except Exception as exc:  # httpx transport errors and the like
            fail(f"{type(exc).__name__}: {exc}")

    return wrapper


def event_line(event: dict[str, Any]) -> str:
    marker = " (ephemeral)" if event.get("ephemeral") else ""
    return f"{event['offset']:>8}  {event['type']:<24} {orjson.dumps(event['payload']).decode()}{marker}"


def info_lines(info: dict[str, Any]) -> str:
    retention = info["retention"]
    return "\n".join(
        [
            f"path        {info['path']}",
            f"stream_id   {info['stream_id']}",
            f"head        {info['head']}   earliest {info['earliest']}",
            f"closed      {info['closed']}   legal hold {info['legal_hold']}   pinned {info['pinned']}",
            f"retention   max_age_s={retention['max_age_s']} max_events={retention['max_events']}",
            f"usage       {info['usage']['durable_events']} events, {info['usage']['durable_bytes']} bytes",
        ]
    )


# --- server and operator commands --------------------------------------------


APP_OPTION_HELP = "module:attr of a Yoke App to run (imported with the current directory on sys.path)"


@main.command()
@DB_OPTION
@click.option("--host", default=None, help="Bind address (default 127.0.0.1)")
@click.option("--port", default=None, type=int, help="Port (default 8080)")
@click.option("--app", "app_spec", envvar="YOKE_APP", default=None, help=APP_OPTION_HELP)
@click.option(
    "--no-executor", is_flag=True,
    help="Serve the API only: appends are stored without fan-out; `yoke worker` runs the actors",
)
def serve(
    database_url: str | None, host: str | None, port: int | None, app_spec: str | None, no_executor: bool
) -> None:
    """Run the HTTP API (embedded SQLite under ./.yoke by default), and with
    --app the application's actors in the same process."""
    app = load_app_or_fail(app_spec) if app_spec is not None else None
    from .http.server import serve as run_server

    settings = Settings.from_env(database_url=database_url, host=host, port=port)

    def on_ready(settings: Settings, token: str) -> None:
        print_banner(settings, token)
        if app is not None:
            mode = "API only (no executor: run `yoke worker`)" if no_executor else "running its actors here"
            click.echo(f"  app:          {app_spec}: {describe_app(app)}; {mode}\n", err=True)
        elif no_executor:
            click.echo("  no executor:  appends are stored without fan-out\n", err=True)

    run_server(settings, app=app, executor=not no_executor, on_ready=on_ready)


def load_app_or_fail(spec: str) -> Any:
    """The App ``spec`` names; the current directory is importable first."""
    from .actors.app import load_app
    from .errors import YokeError

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return load_app(spec)
    except YokeError as exc:
        fail(exc.message)
    except Exception as exc:  # the module does not import, or fails while importing
        fail(f"cannot load {spec}: {type(exc).__name__}: {exc}")


def describe_app(app: Any) -> str:
    actors = ", ".join(app.actors) or "no actors"
    portals = f"; portals {', '.join(app.portals)}" if app.portals else ""
    return f"actors {actors}{portals}"


@main.command()
@DB_OPTION
@click.option("--app", "app_spec", envvar="YOKE_APP", required=True, help=APP_OPTION_HELP)
def worker(database_url: str | None, app_spec: str) -> None:
    """Run the application's actors without HTTP (fan-out, scheduler,
    schedules, portal loops) until SIGTERM/SIGINT, then stop gracefully:
    runs in progress finish (up to YOKE_SHUTDOWN_TIMEOUT_S), queued appends
    commit, and the worker's instances pass to the other workers."""
    import logging

    app = load_app_or_fail(app_spec)
    settings = Settings.from_env(database_url=database_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_work(settings, app, app_spec))
    except KeyboardInterrupt:  # a second signal while stopping
        sys.exit(130)
    except Exception as exc:  # an unreachable or missing database, a bad URL
        fail(f"{settings.database_url}: {type(exc).__name__}: {exc}")


async def _work(settings: Settings, app: Any, app_spec: str) -> None:
    from .runtime import open as open_runtime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with open_runtime(settings=settings, app=app) as runtime:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        click.echo(
            f"yoke worker {runtime.worker_id} on {settings.database_url}: {app_spec}: {describe_app(app)}"
            " (SIGTERM or Ctrl-C to stop)",
            err=True,
        )
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)  # a second signal ends the process at once
            click.echo(f"yoke worker {runtime.worker_id}: stopping", err=True)
    click.echo("yoke worker: stopped", err=True)


def print_banner(settings: Settings, token: str) -> None:
    url = f"http://{settings.host}:{settings.port}"
    token_file = f"{settings.data_dir}/token-{settings.port}"
    auth = f'-H "Authorization: Bearer $(cat {token_file})"'
    click.echo(
        f"""
Yoke is serving {settings.database_url}
  URL:          {url}   (API docs: {url}/docs)
  admin token:  {token}   (saved in {token_file})

Try it (in another terminal, in this directory):
  curl -s -X POST {url}/v1/streams/demo/-/events {auth} -H 'Content-Type: application/json' -d '{{"type":"hello","payload":{{"n":1}}}}'
  curl -s "{url}/v1/streams/demo/-/events?after=0" {auth}
  curl -sN {url}/v1/streams/demo/-/tail {auth}
""",
        err=True,
    )


@main.command()
@DB_OPTION
def migrate(database_url: str | None) -> None:
    """Apply pending database migrations (PostgreSQL; SQLite migrates on open)."""
    settings = Settings.from_env(database_url=database_url)
    url = settings.database_url
    if url.startswith("sqlite:///"):
        _run_or_fail(settings, lambda y: asyncio.sleep(0))
        click.echo(f"{url}: up to date")
        return

    import asyncpg

    from .store.postgres.migrate import migrate as run_migrations

    async def run() -> list[str]:
        conn = await asyncpg.connect(url)
        try:
            return await run_migrations(conn)
        finally:
            await conn.close()

    try:
        applied = asyncio.run(run())
    except Exception as exc:  # an unreachable or missing database
        fail(f"{url}: {type(exc).__name__}: {exc}")
    for name in applied:
        click.echo(f"applied {name}")
    if not applied:
        click.echo("schema up to date")


async def _with_runtime(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from .runtime import open as open_runtime

    async with open_runtime(settings=settings, executor=False) as y:  # no deliveries from here
        return await action(y)


@main.group()
def tokens() -> None:
    """Create, list and revoke API tokens (works on the database directly)."""


@tokens.command("create")
@DB_OPTION
@click.option("--tenant", default="default", show_default=True)
@click.option("--scopes", default="read,append", show_default=True, help="Comma-separated: read, append, admin")
@click.option("--name", default="", help="A label for the token")
@click.option("--json", "as_json", is_flag=True)
def tokens_create(database_url: str | None, tenant: str, scopes: str, name: str, as_json: bool) -> None:
    settings = Settings.from_env(database_url=database_url)

    async def create(y: Any) -> Any:
        return await y.tokens.create(tenant, [s.strip() for s in scopes.split(",") if s.strip()], name)

    new = _run_or_fail(settings, create)
    emit(
        {"token": new.token, "token_id": new.info.token_id, "tenant": tenant, "scopes": list(new.info.scopes)},
        as_json,
        lambda v: f"{v['token']}\n(token id {v['token_id']}, tenant {tenant}, scopes {','.join(v['scopes'])};"
        " shown once)",
    )


@tokens.command("list")
@DB_OPTION
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def tokens_list(database_url: str | None, tenant: str, as_json: bool) -> None:
    settings = Settings.from_env(database_url=database_url)
    listed = _run_or_fail(settings, lambda y: y.tokens.list(tenant))
    rows = [
        {"token_id": t.token_id, "name": t.name, "scopes": list(t.scopes), "revoked": t.revoked_at is not None}
        for t in listed
    ]
    emit(
        rows,
        as_json,
        lambda v: "\n".join(
            f"{r['token_id']}  {','.join(r['scopes']):<18} {'revoked' if r['revoked'] else 'active ':<8} {r['name']}"
            for r in v
        )
        or "(no tokens)",
    )


@tokens.command("revoke")
@DB_OPTION
@click.argument("token_id")
@click.option("--tenant", default="default", show_default=True)
def tokens_revoke(database_url: str | None, token_id: str, tenant: str) -> None:
    settings = Settings.from_env(database_url=database_url)
    if not _run_or_fail(settings, lambda y: y.tokens.revoke(tenant, token_id)):
        fail(f"no active token {token_id} in tenant {tenant}")
    click.echo(f"revoked {token_id}")


def _run_or_fail(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from .errors import YokeError

    try:
        return asyncio.run(_with_runtime(settings, action))
    except YokeError as exc:
        fail(f"{exc.code}: {exc.message}")
    except Exception as exc:  # an unreachable or missing database, a bad URL
        fail(f"{settings.database_url}: {type(exc).__name__}: {exc}")


# --- stream commands (HTTP) ------------------------------------------------------


@main.command()
@click.argument("path")
@click.argument("type_")
@click.argument("payload", required=False, default=None)
@click.option("--idempotency-key", default=None)
@http_command
def append(client: Client, as_json: bool, path: str, type_: str, payload: str | None, idempotency_key: str | None) -> None:
    """Append one event: yoke append /orders order.placed '{"id": 7}'"""
    event: dict[str, Any] = {"type": type_}
    if payload is not None:
        try:
            event["payload"] = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            fail(f"PAYLOAD is not valid JSON: {exc}")
    if idempotency_key:
        event["idempotency_key"] = idempotency_key
    result = client.append(path, event)
    emit(result, as_json, lambda r: f"appended {path} offset {r['offset']} id {r['id']}")


@main.command()
@click.argument("path")
@click.option("--after", default=0, show_default=True, type=int)
@click.option("--limit", default=100, show_default=True, type=int)
@http_command
def read(client: Client, as_json: bool, path: str, after: int, limit: int) -> None:
    """Read events with offset > --after."""
    page = client.read(path, after, limit)
    emit(page, as_json, lambda p: "\n".join(event_line(e) for e in p["events"]) or "(no events)")


@main.command()
@click.argument("path")
@click.option("--after", default=0, show_default=True, type=int)
@http_command
def tail(client: Client, as_json: bool, path: str, after: int) -> None:
    """Print events after --after, then follow live ones (Ctrl-C to stop)."""
    try:
        for event in client.tail(path, after):
            emit(event, as_json, event_line)
    except KeyboardInterrupt:
        return
    fail("the server ended the tail (is it shutting down?)")


@main.command()
@click.argument("prefix", required=False, default="/")
@http_command
def streams(client: Client, as_json: bool, prefix: str) -> None:
    """List streams whose path starts with PREFIX."""
    listed = client.streams(prefix)["streams"]
    emit(
        listed,
        as_json,
        lambda v: "\n".join(f"{s['path']:<40} head {s['head']:>8}{'  closed' if s['closed'] else ''}" for s in v)
        or "(no streams)",
    )


@main.group()
def stream() -> None:
    """Inspect and change one stream."""


@stream.command("info")
@click.argument("path")
@http_command
def stream_info(client: Client, as_json: bool, path: str) -> None:
    emit(client.info(path), as_json, info_lines)


@stream.command("close")
@click.argument("path")
@http_command
def stream_close(client: Client, as_json: bool, path: str) -> None:
    emit(client.close_stream(path), as_json, lambda i: f"closed {i['path']} at head {i['head']}")


@stream.command("retention")
@click.argument("path")
@click.option("--max-age", "max_age_s", type=float, default=None, help="Seconds (omit: unlimited)")
@click.option("--max-events", type=int, default=None, help="Newest events kept (omit: unlimited)")
@http_command
def stream_retention(client: Client, as_json: bool, path: str, max_age_s: float | None, max_events: int | None) -> None:
    emit(client.set_retention(path, max_age_s, max_events), as_json, info_lines)


@stream.command("hold")
@click.argument("path")
@click.argument("state", type=click.Choice(["on", "off"]))
@http_command
def stream_hold(client: Client, as_json: bool, path: str, state: str) -> None:
    emit(client.set_legal_hold(path, state == "on"), as_json, lambda i: f"legal hold {state} for {i['path']}")


# --- actor commands (HTTP) ---------------------------------------------------------


def json_option(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        fail(f"{name} is not valid JSON: {exc}")


def instance_line(i: dict[str, Any]) -> str:
    return f"{i['id']}  {i['actor']:<20} {i['key']:<24} worker {i['worker_id'] or '-'}"


def instance_lines(i: dict[str, Any]) -> str:
    lines = [
        f"id          {i['id']}",
        f"actor       {i['actor']}   key {i['key']}",
        f"config      {orjson.dumps(i['config']).decode()}",
        f"filter      {orjson.dumps(i['filter']).decode() if i['filter'] is not None else '(routed by key)'}",
        f"parent      {i['parent_id'] or '-'}   worker {i['worker_id'] or '-'}",
    ]
    if "state" in i:
        state, q = i["state"], i["queue"]
        lines += [
            f"state       version {state['version']}  {orjson.dumps(state['value']).decode()}",
            f"queue       {q['pending']} pending, {q['processing']} processing, {q['dead']} dead",
        ]
    return "\n".join(lines)


def queue_row_line(r: dict[str, Any]) -> str:
    where = f"{r['path']}@{r['offset']}" if r["path"] is not None else "(sent)"
    error = (r["last_error"] or "").splitlines()[0][:80] if r["last_error"] else ""
    event_type = (r["event"] or {}).get("type", "?")
    return f"{r['qid']:>8}  attempts {r['attempts']:<3} {where:<28} {event_type:<24} {error}"


@main.group()
def instances() -> None:
    """List, create and inspect actor instances of the token's tenant."""


@instances.command("list")
@click.option("--actor", default=None, help="Only instances of this actor")
@click.option("--limit", default=100, show_default=True, type=int)
@click.option("--after", default=None, help="Continue after this instance id")
@http_command
def instances_list(client: Client, as_json: bool, actor: str | None, limit: int, after: str | None) -> None:
    listed = client.instances(actor, limit, after)["instances"]
    emit(listed, as_json, lambda v: "\n".join(instance_line(i) for i in v) or "(no instances)")


@instances.command("create")
@click.argument("actor")
@click.option("--key", default=None, help="The instance key (default: a new one)")
@click.option("--config", "config_json", default=None, help="Config, a JSON object")
@click.option("--filter", "filter_json", default=None, help='Filter, JSON: {"types": [...], "streams": [...], "where": "..."}')
@http_command
def instances_create(
    client: Client, as_json: bool, actor: str, key: str | None, config_json: str | None, filter_json: str | None
) -> None:
    """Create the instance (ACTOR, --key), or show the existing one."""
    config = json_option(config_json, "--config")
    filter_ = json_option(filter_json, "--filter")
    created = client.create_instance(actor, key, config, filter_)
    emit(
        created,
        as_json,
        lambda i: f"{'created' if i['created'] else 'exists '} {i['id']} (actor {i['actor']}, key {i['key']})",
    )


@instances.command("show")
@click.argument("instance_id")
@http_command
def instances_show(client: Client, as_json: bool, instance_id: str) -> None:
    """An instance, its state and its queue depth."""
    emit(client.instance(instance_id), as_json, instance_lines)


@main.group()
def dlq() -> None:
    """Dead-lettered queue rows of an instance: list, redrive, drop."""


@dlq.command("list")
@click.argument("instance_id")
@click.option("--limit", default=100, show_default=True, type=int)
@http_command
def dlq_list(client: Client, as_json: bool, instance_id: str, limit: int) -> None:
    rows = client.dead_letters(instance_id, limit)["rows"]
    emit(rows, as_json, lambda v: "\n".join(queue_row_line(r) for r in v) or "(no dead rows)")


QID_OPTION = click.option(
    "--qid", "qids", multiple=True, type=int, help="A dead row's qid (repeatable; default: all dead rows)"
)


@dlq.command("redrive")
@click.argument("instance_id")
@QID_OPTION
@http_command
def dlq_redrive(client: Client, as_json: bool, instance_id: str, qids: tuple[int, ...]) -> None:
    """Dead rows back to pending, attempts reset."""
    result = client.redrive(instance_id, list(qids) or None)
    emit(result, as_json, lambda r: f"redriven {r['redriven']} row(s) of {instance_id}")


@dlq.command("drop")
@click.argument("instance_id")
@QID_OPTION
@http_command
def dlq_drop(client: Client, as_json: bool, instance_id: str, qids: tuple[int, ...]) -> None:
    """Delete dead rows."""
    result = client.drop_dead(instance_id, list(qids) or None)
    emit(result, as_json, lambda r: f"dropped {r['dropped']} row(s) of {instance_id}")


# --- subscription commands (HTTP) ---------------------------------------------------


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
    if s["halted"] is not None:
        return f"halted at {s['halted'].get('offset')}"
    if s["next_retry_at"] is not None:
        return f"retrying (attempt {s['attempts'] + 1})"
    return "running"


def subscription_line(s: dict[str, Any]) -> str:
    return (
        f"{s['name']:<24} {receiver_text(s['config']):<36} through {s['processed_through_offset']:>6}"
        f"  lag {s['lag']:>6}  {subscription_state(s)}"
    )


def subscription_lines(s: dict[str, Any]) -> str:
    c = s["config"]
    lines = [
        f"name        {s['name']}   on {s['path']}",
        f"receiver    {receiver_text(c)}",
        f"filter      {orjson.dumps(c['filter']).decode() if c.get('filter') else '(every event)'}",
        f"transform   {c.get('transform') or '-'}",
        f"start       {c.get('start')}   on failing event: {c.get('on_failing_event')}",
        f"configured  at offset {s['configured_at']}   generation {s['generation']}",
        f"cursor      processed through {s['processed_through_offset']}   head {s['head']}   lag {s['lag']}",
        f"state       {subscription_state(s)}   {s['delivered']} delivered, {s['failures']} failures",
    ]
    if s["halted"] is not None:
        lines.append(f"halted      {orjson.dumps(s['halted']).decode()}")
    if s["last_error"]:
        lines.append(f"last error  {s['last_error'].splitlines()[0][:200]}")
    return "\n".join(lines)


@main.group()
def subscriptions() -> None:
    """Subscriptions of a source stream: list, show, add, remove, resume, cursor, wait."""


@subscriptions.command("list")
@click.argument("path")
@http_command
def subscriptions_list(client: Client, as_json: bool, path: str) -> None:
    """The subscriptions of the stream PATH."""
    listed = client.subscriptions(path)["subscriptions"]
    emit(listed, as_json, lambda v: "\n".join(subscription_line(s) for s in v) or "(no subscriptions)")


@subscriptions.command("show")
@click.argument("path")
@click.argument("name")
@http_command
def subscriptions_show(client: Client, as_json: bool, path: str, name: str) -> None:
    """Configuration, cursor, lag, halt and last error of one subscription."""
    emit(client.subscription(path, name), as_json, subscription_lines)


@subscriptions.command("add")
@click.argument("path")
@click.option("--name", default=None, help="The subscription's name (default: generated)")
@click.option("--copy-to", "copy_to", default=None, metavar="PATH", help="Receiver: append copies to this stream")
@click.option("--call", "call_name", default=None, metavar="NAME", help="Receiver: the app's @app.receiver(NAME)")
@click.option("--processor", default=None, metavar="NAME", help="Receiver: the app's @app.processor(NAME)")
@click.option("--webhook", default=None, metavar="URL", help="Receiver: POST each event to this http(s) URL")
@click.option("--secret", default=None, help="The webhook's whsec_ secret (default: generated, printed once)")
@click.option("--types", default=None, help="Only these event types, comma-separated: exact, prefix.* or *")
@click.option("--where", default=None, help="Only events for which this JSONata is true")
@click.option("--transform", default=None, help="JSONata reshaping each event into {type?, payload?, metadata?}")
@click.option("--start", type=click.Choice(["now", "beginning"]), default=None, help="Default: now")
@click.option("--on-failing-event", type=click.Choice(["halt", "skip"]), default=None, help="Default: halt")
@http_command
def subscriptions_add(
    client: Client, as_json: bool, path: str, name: str | None, copy_to: str | None, call_name: str | None,
    processor: str | None, webhook: str | None, secret: str | None, types: str | None, where: str | None,
    transform: str | None, start: str | None, on_failing_event: str | None,
) -> None:
    """Configure a subscription of PATH with one receiver (the same
    configuration again changes nothing)."""
    chosen = [
        (option, value)
        for option, value in (
            ("--copy-to", copy_to), ("--call", call_name), ("--processor", processor), ("--webhook", webhook)
        )
        if value is not None
    ]
    if len(chosen) != 1:
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
        verb = "created" if r["created"] else "exists "
        line = f"{verb} {r['name']} on {r['path']} (configured at offset {r['offset']})"
        if r["secret"]:
            line += f"\nwebhook secret (shown once): {r['secret']}"
        return line

    emit(result, as_json, human)


@subscriptions.command("remove")
@click.argument("path")
@click.argument("name")
@http_command
def subscriptions_remove(client: Client, as_json: bool, path: str, name: str) -> None:
    """Remove a subscription (its configuration stays in the stream's log)."""
    client.unsubscribe(path, name)
    emit({"removed": name, "path": path}, as_json, lambda r: f"removed {name} from {path}")


@subscriptions.command("resume")
@click.argument("path")
@click.argument("name")
@http_command
def subscriptions_resume(client: Client, as_json: bool, path: str, name: str) -> None:
    """Resume a halted subscription where it stopped."""
    status = client.resume_subscription(path, name)
    emit(status, as_json, lambda s: f"{s['name']}: {subscription_state(s)}, processed through "
         f"{s['processed_through_offset']} (lag {s['lag']})")


@subscriptions.command("cursor")
@click.argument("path")
@click.argument("name")
@click.argument("after_offset", type=int)
@click.option("--resume", is_flag=True, help="Also resume it if halted")
@http_command
def subscriptions_cursor(client: Client, as_json: bool, path: str, name: str, after_offset: int, resume: bool) -> None:
    """Deliver again (or skip ahead) from AFTER_OFFSET + 1: a new delivery run."""
    status = client.set_subscription_cursor(path, name, after_offset, resume)
    emit(status, as_json, lambda s: f"{s['name']}: cursor after {s['processed_through_offset']}"
         f" (generation {s['generation']}), {subscription_state(s)}")


@subscriptions.command("wait")
@click.argument("path")
@click.argument("name")
@click.argument("offset", type=int, required=False)
@click.option("--timeout", "timeout_s", type=float, default=20.0, show_default=True, help="Seconds (at most 60)")
@http_command
def subscriptions_wait(
    client: Client, as_json: bool, path: str, name: str, offset: int | None, timeout_s: float
) -> None:
    """Wait until NAME processed through OFFSET (default: the stream's head);
    exits 1 with not_processed after --timeout."""
    status = client.wait_subscription(path, name, offset, timeout_s)
    emit(status, as_json, lambda s: f"{s['name']}: processed through {s['processed_through_offset']}"
         f" (head {s['head']})")


@main.command()
@DB_OPTION
def demo(database_url: str | None) -> None:
    """Append, read and tail a stream through the Python API (no server)."""
    asyncio.run(_demo(database_url))


async def _demo(database_url: str | None) -> None:
    import yoke

    async with yoke.open(database_url) as y:
        click.echo(f"Yoke {yoke.__version__} on {y.settings.database_url}")
        orders = y.stream("/demo/orders")
        try:
            start = (await orders.info()).head
        except yoke.StreamNotFound:
            start = 0
        tail_events = orders.tail(after=start)
        results = await orders.append_many(
            [{"type": "order.placed", "payload": {"order": n, "qty": n}} for n in (1, 2, 3)]
        )
        click.echo(f"appended offsets {[r.offset for r in results]}")
        await orders.append({"type": "order.progress", "payload": {"pct": 50}, "ephemeral": True})
        await orders.append({"type": "order.shipped", "payload": {"order": 1}})
        count = 0
        async for event in tail_events:
            click.echo(event_line(event.to_dict()))
            count += 1
            if count == 5:
                break
        await tail_events.aclose()


if __name__ == "__main__":
    sys.exit(main())
