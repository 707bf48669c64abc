"""Server and database commands: ``serve``, ``worker`` and ``migrate``."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .. import heap
from .common import DB_OPTION, JSON_OPTION, SettingsCommand, command, emit, fail

if TYPE_CHECKING:
    from ..config import Settings

ISOLATION_OPTION = click.option(
    "--isolation", type=click.Choice(["inprocess", "process"]), default=None,
    help="Where actors' process() runs unless an actor says: inprocess (this process's event loop;"
         " fast, unisolated) or process (a pool of host processes; docs/hosts.md). Default"
         " inprocess; YOKE_ISOLATION.",
)
RELOAD_OPTION = click.option(
    "--reload", is_flag=True, default=None,
    help="Start new hosts when the app's code changes (its Python files, its Node actors' scripts):"
         " isolated actors run the new code"
         " (runs in progress finish on the old hosts), and the code's hash is part of the deploy"
         " version, so subscriptions halted under the old code resume; YOKE_RELOAD.",
)
APP_OPTION_HELP = "module:attr of a Yoke App to run, like examples.orders:app (imported with the current directory on sys.path)."


class ServeCommand(SettingsCommand):
    extra_env = (("YOKE_APP", "(none)  the --app to run"),)


def settings_or_fail(**overrides: Any) -> Settings:
    from ..config import Settings

    try:
        return Settings.from_env(**overrides)
    except ValueError as exc:  # YOKE_PORT=abc and the like
        fail(f"a YOKE_* setting has a bad value: {exc}")


def redact(url: str) -> str:
    """``url`` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def listen_failure(exc: OSError, host: str, port: int) -> str:
    """One line saying why ``host:port`` cannot be had, and the fix."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where} is already in use (another Yoke server?); choose another port: "
            "`yoke serve --port N` or `make run PORT=N`"
        )
    if exc.errno == errno.EACCES:
        return f"not allowed to listen on {where} (ports below 1024 need privileges); use --port N"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: unknown host {host!r} (--host or YOKE_HOST)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {host} is not an address of this machine (--host or YOKE_HOST)"
    return f"cannot listen on {where}: {exc.strerror or exc}"


def load_app_or_fail(spec: str) -> Any:
    """The App ``spec`` names; the current directory is importable first."""
    from ..actors.app import load_app
    from ..errors import YokeError

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


@command(cls=ServeCommand, short_help="Run the HTTP API (and with --app the actors); prints URL and token.")
@DB_OPTION
@click.option("--host", default=None, metavar="HOST", help="Address to listen on (default 127.0.0.1; YOKE_HOST).")
@click.option("--port", default=None, type=click.IntRange(0, 65535), metavar="PORT",
              help="Port to listen on (default 8080; YOKE_PORT; 0 picks a free one).")
@click.option("--app", "app_spec", envvar="YOKE_APP", default=None, metavar="MODULE:ATTR", help=APP_OPTION_HELP)
@click.option(
    "--no-executor", is_flag=True,
    help="Serve the API only: appends are stored without fan-out; `yoke worker` runs the actors.",
)
@click.option(
    "--max-connections", type=click.IntRange(1), default=None, metavar="N",
    help="Connections served at once, SSE tails included; past it 503, health checks excepted"
         " (default 1000; YOKE_HTTP_MAX_CONNECTIONS).",
)
@click.option(
    "--header-timeout", type=click.FloatRange(0, min_open=True), default=None, metavar="SECONDS",
    help="Seconds for a request's line and headers to arrive (default 10; YOKE_HTTP_HEADER_TIMEOUT_S).",
)
@click.option(
    "--body-timeout", type=click.FloatRange(0, min_open=True), default=None, metavar="SECONDS",
    help="Seconds for a request's body to arrive after its headers (default 60; YOKE_HTTP_BODY_TIMEOUT_S).",
)
@click.option(
    "--dev", is_flag=True,
    help="Development: requests without a token act as tenant default with every scope"
         " (authentication off; loopback addresses only).",
)
@click.option(
    "--workers", type=click.IntRange(1), default=1, metavar="N",
    help="Server processes sharing the port, each with its own runtime (PostgreSQL only; default 1).",
)
@ISOLATION_OPTION
@RELOAD_OPTION
@JSON_OPTION
def serve(
    database_url: str | None, host: str | None, port: int | None, app_spec: str | None, no_executor: bool,
    max_connections: int | None, header_timeout: float | None, body_timeout: float | None, dev: bool,
    workers: int, isolation: str | None, reload: bool | None, as_json: bool,
) -> None:
    """Run the HTTP API (embedded SQLite under ./.yoke by default), and with
    --app the application's actors in the same process.

    Once ready it prints the URL, the admin token of tenant default (also
    written to .yoke/token-PORT, mode 0600, where the CLI finds it) and curl
    commands to try; with --json, one JSON line instead. Servers on other
    ports can run from the same directory: each has its own token file.
    """
    settings = settings_or_fail(
        database_url=database_url, host=host, port=port, http_max_connections=max_connections,
        http_header_timeout_s=header_timeout, http_body_timeout_s=body_timeout, isolation=isolation,
        reload=reload or None,
    )
    from ..http.server import bind_socket, is_loopback
    from ..http.server import serve as run_server

    if workers > 1 and not settings.database_url.startswith(("postgresql://", "postgres://")):
        fail("--workers needs PostgreSQL: one process owns a SQLite file (its writes go through one"
             " writer thread; other processes would only queue behind its lock)")
    if workers > 1 and settings.reload:
        fail("--workers and --reload do not go together: reload with one worker while developing")
    if dev and not is_loopback(settings.host):
        fail(f"--dev turns authentication off, so it listens on a loopback address only"
             f" (127.0.0.1, ::1, localhost), not {settings.host}")
    try:  # before anything is loaded or announced
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        fail(listen_failure(exc, settings.host, settings.port))
    app = load_app_or_fail(app_spec) if app_spec is not None else None

    def on_ready(settings: Settings, token: str, console: str) -> None:
        from .. import tokenfile

        token_file = str(tokenfile.token_file(settings.data_dir, settings.port))
        url = f"http://{settings.host}:{settings.port}"
        if as_json:
            emit(
                {
                    "url": url, "token_file": token_file, "database_url": redact(settings.database_url),
                    "app": app_spec, "executor": not no_executor, "console": console, "dev": dev,
                    "workers": workers,
                },
                True, str,
            )
            sys.stdout.flush()
            return
        print_banner(settings, token, token_file, console)
        if workers > 1:
            click.echo(f"  workers:      {workers} server processes share this port\n", err=True)
        if dev:
            click.echo("  authentication is OFF (--dev): requests without a token act as tenant default"
                       " with every scope\n", err=True)
        if app is not None:
            mode = "API only (no executor: run `yoke worker`)" if no_executor else "running its actors here"
            click.echo(f"  app:          {app_spec}: {describe_app(app)}; {mode}\n", err=True)
        elif no_executor:
            click.echo("  no executor:  appends are stored without fan-out\n", err=True)

    def serve_one(announce: bool, on_stop: Callable[[], None] | None = None) -> None:
        run_server(settings, app=app, executor=not no_executor, on_ready=on_ready if announce else None,
                   sock=sock, dev=dev, announce=announce, on_stop=on_stop)

    if workers == 1:
        serve_one(True)
        return
    from ..http.workers import serve_forked

    serve_forked(workers, serve_one)


def cli_name() -> str:
    """How to call this CLI from here: ``yoke`` if that is on PATH, else its
    path (``.venv/bin/yoke`` under ``make run``)."""
    import shutil

    argv0 = sys.argv[0]
    if os.path.basename(argv0) != "yoke":
        return "yoke"  # python -m yoke.cli
    on_path = shutil.which("yoke")
    if on_path is not None and os.path.realpath(on_path) == os.path.realpath(argv0):
        return "yoke"
    relative = os.path.relpath(argv0)
    return argv0 if relative.startswith("..") else relative


def print_banner(settings: Settings, token: str, token_file: str, console: str) -> None:
    url = f"http://{settings.host}:{settings.port}"
    auth = f'-H "Authorization: Bearer $(cat {token_file})"'
    cli = cli_name() + " read /demo" + ("" if settings.port == 8080 else f" --url {url}")
    click.echo(
        f"""
Yoke is serving {redact(settings.database_url)}
  URL:          {url}   (API docs: {url}/docs)
  admin token:  {token}   (saved in {token_file})
  console:      {console}   (signs a browser in, once)

Try it (in another terminal, in this directory):
  curl -s -X POST {url}/v1/streams/demo/-/events {auth} -H 'Content-Type: application/json' -d '{{"type":"hello","payload":{{"n":1}}}}'
  curl -s "{url}/v1/streams/demo/-/events?after=0" {auth}
  curl -sN {url}/v1/streams/demo/-/tail {auth}
  {cli}   # the CLI: --help lists every command
""",
        err=True,
    )


class WorkerCommand(SettingsCommand):
    extra_env = (("YOKE_APP", "(none)  the --app to run"),)


@command(cls=WorkerCommand, short_help="Run an app's actors without HTTP, next to a server on the same database.")
@DB_OPTION
@click.option("--app", "app_spec", envvar="YOKE_APP", required=True, metavar="MODULE:ATTR", help=APP_OPTION_HELP)
@ISOLATION_OPTION
@RELOAD_OPTION
@JSON_OPTION
def worker(
    database_url: str | None, app_spec: str, isolation: str | None, reload: bool | None, as_json: bool,
) -> None:
    """Run the application's actors without HTTP (fan-out, scheduler,
    schedules, portal loops) until SIGTERM/SIGINT, then stop gracefully:
    runs in progress finish (up to YOKE_SHUTDOWN_TIMEOUT_S), queued appends
    commit, and the worker's instances pass to the other workers. With
    --json, a JSON line on stdout once it runs."""
    import asyncio
    import logging

    app = load_app_or_fail(app_spec)
    settings = settings_or_fail(database_url=database_url, isolation=isolation, reload=reload or None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_work(settings, app, app_spec, as_json))
    except KeyboardInterrupt:  # a second signal while stopping
        sys.exit(130)
    except Exception as exc:  # an unreachable or missing database, a bad URL
        fail(f"{redact(settings.database_url)}: {type(exc).__name__}: {exc}")


async def _work(settings: Settings, app: Any, app_spec: str, as_json: bool) -> None:
    import asyncio

    from ..runtime import open as open_runtime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with open_runtime(settings=settings, app=app) as runtime:
        heap.settle()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if as_json:
            emit({"worker_id": runtime.worker_id, "database_url": redact(settings.database_url), "app": app_spec},
                 True, str)
            sys.stdout.flush()
        click.echo(
            f"yoke worker {runtime.worker_id} on {redact(settings.database_url)}: {app_spec}: "
            f"{describe_app(app)} (SIGTERM or Ctrl-C to stop)",
            err=True,
        )
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)  # a second signal ends the process at once
            click.echo(f"yoke worker {runtime.worker_id}: stopping", err=True)
    click.echo("yoke worker: stopped", err=True)


@command(short_help="Apply pending database migrations now.")
@DB_OPTION
@JSON_OPTION
def migrate(database_url: str | None, as_json: bool) -> None:
    """Apply pending database migrations now (PostgreSQL; SQLite migrates
    when opened). Servers and workers also migrate when they start."""
    import asyncio
    from .tokens import run_or_fail

    settings = settings_or_fail(database_url=database_url)
    url = settings.database_url
    if url.startswith("sqlite:///"):
        run_or_fail(settings, lambda y: asyncio.sleep(0))
        emit({"database_url": url, "applied": []}, as_json, lambda v: f"{url}: up to date")
        return

    import asyncpg

    from ..store.postgres.migrate import migrate as run_migrations

    async def run() -> list[str]:
        conn = await asyncpg.connect(url)
        try:
            return await run_migrations(conn)
        finally:
            await conn.close()

    try:
        applied = asyncio.run(run())
    except Exception as exc:  # an unreachable or missing database
        fail(f"{redact(url)}: {type(exc).__name__}: {exc}")
    emit(
        {"database_url": redact(url), "applied": applied},
        as_json,
        lambda v: "\n".join(f"applied {name}" for name in applied) or "schema up to date",
    )
