"""The ``yoke`` command line.

Server and operator commands (``serve``, ``migrate``, ``tokens``) work on the
database directly. Stream commands (``append``, ``read``, ``tail``,
``streams``, ``stream ...``) talk HTTP to ``--url`` with ``--token``
(default: ``YOKE_TOKEN``, else ``./.yoke/token`` written by ``yoke serve``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click
import orjson

from .client import DEFAULT_URL, Client, ClientError, default_token
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
    @click.option("--token", default=None, help="Bearer token (default: $YOKE_TOKEN or ./.yoke/token)")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
    @wraps(fn)
    def wrapper(url: str, token: str | None, as_json: bool, **kwargs: Any) -> None:
        token = token or default_token()
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


@main.command()
@DB_OPTION
@click.option("--host", default=None, help="Bind address (default 127.0.0.1)")
@click.option("--port", default=None, type=int, help="Port (default 8080)")
@click.option("--app", "app_spec", default=None, help="module:attr of a Yoke App to run")
def serve(database_url: str | None, host: str | None, port: int | None, app_spec: str | None) -> None:
    """Run the HTTP API (embedded SQLite under ./.yoke by default)."""
    from .http.server import serve as run_server

    if app_spec is not None:
        fail("--app needs the actor runtime, which this version does not include yet")
    settings = Settings.from_env(database_url=database_url, host=host, port=port)
    run_server(settings, on_ready=print_banner)


def print_banner(settings: Settings, token: str) -> None:
    url = f"http://{settings.host}:{settings.port}"
    auth = f'-H "Authorization: Bearer $(cat {settings.data_dir}/token)"'
    click.echo(
        f"""
Yoke is serving {settings.database_url}
  URL:          {url}   (API docs: {url}/docs)
  admin token:  {token}   (saved in {settings.data_dir}/token)

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

    async with open_runtime(settings=settings) as y:
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
