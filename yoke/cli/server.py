"""Server and database commands: ``serve``, ``worker`` and ``migrate``."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from .. import descriptors, heap
from .common import DB_OPTION, JSON_OPTION, SettingsCommand, command, emit, fail

if TYPE_CHECKING:
    from ..config import Settings

NO_MIGRATE_OPTION = click.option(
    "--no-migrate", is_flag=True, default=None,
    help="Do not apply pending migrations at start: with one pending, refuse to start (run `yoke migrate`"
         " with this build first; docs/production/upgrades.md); YOKE_MIGRATE=false.",
)

log = logging.getLogger("yoke.cli")

ISOLATION_OPTION = click.option(
    "--isolation", type=click.Choice(["inprocess", "process"]), default=None,
    help="Where actors' process() runs unless an actor says: inprocess (this process's event loop;"
         " fast, unisolated) or process (a pool of host processes; docs/advanced/hosts.md). Default"
         " inprocess; YOKE_ISOLATION.",
)
RELOAD_OPTION = click.option(
    "--reload", is_flag=True, default=None,
    help="Start new hosts when the app's code changes (its Python files, its Node actors' scripts):"
         " isolated actors run the new code"
         " (runs in progress finish on the old hosts), and the code's hash is part of the deploy"
         " version, so subscriptions halted under the old code resume; YOKE_RELOAD.",
)
LOG_LEVEL_OPTION = click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
    help="Lowest level logged, uvicorn's lines included (default info; YOKE_LOG_LEVEL).",
)
LOG_FORMAT_OPTION = click.option(
    "--log-format", type=click.Choice(["text", "json"]), default=None,
    help="Log lines as text or one JSON object each, on stderr (default text; YOKE_LOG_FORMAT).",
)
TRACING_OPTION = click.option(
    "--tracing", type=click.Choice(["off", "otlp"]), default=None,
    help="otlp: export Yoke's spans over OTLP/HTTP, configured by the standard OTEL_* variables"
         " (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER...); default off (YOKE_TRACING).",
)
APP_OPTION_HELP = "module:attr of a Yoke App to run, like yoke.examples.orders:app (imported with the current directory on sys.path)."


class ServeCommand(SettingsCommand):
    extra_env = (("YOKE_APP", "(none)  the --app to run"),)


def settings_or_fail(kind: str = "cli", **overrides: Any) -> Settings:
    """The settings, flags over YOKE_*; PostgreSQL connections named for
    the process ``kind`` (serve, worker, migrate, cli) unless
    YOKE_PG_APPLICATION_NAME names them."""
    from ..config import Settings

    if "YOKE_PG_APPLICATION_NAME" not in os.environ:
        overrides.setdefault("pg_application_name", f"yoke {kind}")
    try:
        return Settings.from_env(**overrides)
    except ValueError as exc:  # YOKE_PORT=abc and the like
        fail(f"a YOKE_* setting has a bad value: {exc}")


def setup_logging(settings: Settings) -> None:
    """serve's and worker's one logging setup (yoke/logs.py)."""
    from .. import logs

    try:
        logs.setup(settings.log_level, settings.log_format, access_log=settings.access_log,
                   stream=settings.log_stream)
    except ValueError as exc:  # YOKE_LOG_LEVEL=loud
        fail(f"YOKE_LOG_LEVEL / YOKE_LOG_FORMAT / YOKE_LOG_STREAM: {exc}")


@contextlib.contextmanager
def tracing_installed(settings: Settings, kind: str) -> Iterator[None]:
    """``--tracing otlp``: an SDK provider for this process (after a fork:
    each server process has its own exporter), flushed when it ends."""
    if settings.tracing in ("", "off"):
        yield
        return
    if settings.tracing != "otlp":
        fail(f"YOKE_TRACING is off or otlp, not {settings.tracing!r}")
    from .. import tracing

    try:
        tracing.install_otlp()
    except RuntimeError as exc:  # the SDK is not installed
        fail(str(exc))
    try:
        yield
    finally:
        tracing.shutdown()


def redact(url: str) -> str:
    """``url`` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def listen_failure(exc: OSError, host: str, port: int, option: str = "") -> str:
    """One line saying why ``host:port`` cannot be had, and the fix
    (``option``: the worker's ``--metrics-port``; else serve's port)."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        if option:
            return f"{where} is already in use; choose another port: `yoke worker {option} N`"
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
    """The App ``spec`` names (``module:attribute``, or a JavaScript
    application's path); the current directory is importable first."""
    from ..applications import load
    from ..errors import YokeError

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return load(spec)
    except YokeError as exc:
        fail(exc.message)
    except Exception as exc:  # the module does not import, or fails while importing
        fail(f"cannot load {spec}: {type(exc).__name__}: {exc}")


def describe_app(app: Any) -> str:
    actors = ", ".join(app.actors) or "no actors"
    portals = f"; portals {', '.join(app.portals)}" if app.portals else ""
    return f"actors {actors}{portals}"


@command(cls=ServeCommand, short_help="Run the HTTP API (and with --app the actors); prints URL and token file.")
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
    "--workers", type=click.IntRange(1), default=1, metavar="N", envvar="YOKE_WORKERS",
    help="Server processes sharing the port, each with its own runtime (PostgreSQL only; default 1;"
         " YOKE_WORKERS).",
)
@click.option(
    "--print-token", is_flag=True,
    help="Print the secrets: the admin token, and the console's one-time sign-in link also when stderr is"
         " not a terminal. Without it the token stays in its file (.yoke/token-PORT, mode 0600) and the"
         " link is printed on a terminal only, so neither reaches a log collector.",
)
@click.option(
    "--rotate-token", is_flag=True,
    help="Replace this data directory's admin token with a new one; the old one is revoked and every"
         " token file of the directory that held it is rewritten.",
)
@click.option(
    "--proxy-headers", is_flag=True, default=None,
    help="Behind a reverse proxy (TLS ends there): take the scheme (so the console's cookie is Secure) and"
         " the client's address from X-Forwarded-Proto/-For, sent by --forwarded-allow-ips only"
         " (YOKE_PROXY_HEADERS).",
)
@click.option(
    "--forwarded-allow-ips", default=None, metavar="IPS",
    help="The proxies --proxy-headers trusts: comma-separated addresses or networks, * for any"
         " (default 127.0.0.1; YOKE_FORWARDED_ALLOW_IPS).",
)
@click.option("--tls-cert", default=None, metavar="FILE",
              help="Serve HTTPS with this certificate (PEM; with --tls-key; YOKE_TLS_CERT).")
@click.option("--tls-key", default=None, metavar="FILE", help="The certificate's private key (PEM; YOKE_TLS_KEY).")
@click.option(
    "--cors-origins", default=None, metavar="ORIGINS",
    help="Browser origins allowed on /v1 and /v1/stream: comma-separated (https://app.example.com), * for"
         " any or none. Default: the Durable Streams routes any, /v1 none (YOKE_CORS_ORIGINS).",
)
@ISOLATION_OPTION
@RELOAD_OPTION
@NO_MIGRATE_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
@TRACING_OPTION
@JSON_OPTION
def serve(
    database_url: str | None, host: str | None, port: int | None, app_spec: str | None, no_executor: bool,
    max_connections: int | None, header_timeout: float | None, body_timeout: float | None, dev: bool,
    workers: int, print_token: bool, rotate_token: bool, proxy_headers: bool | None,
    forwarded_allow_ips: str | None, tls_cert: str | None, tls_key: str | None, cors_origins: str | None,
    isolation: str | None, reload: bool | None, no_migrate: bool | None, log_level: str | None,
    log_format: str | None, tracing: str | None, as_json: bool,
) -> None:
    """Run the HTTP API (embedded SQLite under ./.yoke by default), and with
    --app the application's actors in the same process.

    Once ready it prints the URL, where the admin token of tenant default is
    (.yoke/token-PORT, mode 0600, where the CLI finds it; one token per data
    directory, reused on restart) and curl commands to try; on a terminal
    also a console sign-in link; with --json, one JSON line instead. Servers
    on other ports can run from the same directory: each has its token file.
    """
    settings = settings_or_fail(
        "serve", database_url=database_url, host=host, port=port, http_max_connections=max_connections,
        http_header_timeout_s=header_timeout, http_body_timeout_s=body_timeout, isolation=isolation,
        reload=reload or None, migrate=False if no_migrate else None, log_level=log_level, log_format=log_format,
        proxy_headers=proxy_headers, forwarded_allow_ips=forwarded_allow_ips, tls_cert=tls_cert, tls_key=tls_key,
        cors_origins=cors_origins, tracing=tracing,
    )
    setup_logging(settings)
    descriptors.raise_soft_limit()  # instance databases: three descriptors each
    from ..http.addresses import url_host
    from ..http.cors import CorsPolicy
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
    if bool(settings.tls_cert) != bool(settings.tls_key):
        fail("HTTPS needs both --tls-cert and --tls-key (YOKE_TLS_CERT, YOKE_TLS_KEY)")
    try:
        CorsPolicy.parse(settings.cors_origins)
    except ValueError as exc:
        fail(f"--cors-origins / YOKE_CORS_ORIGINS: {exc}")
    try:  # before anything is loaded or announced
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        fail(listen_failure(exc, settings.host, settings.port))
    app = load_app_or_fail(app_spec) if app_spec is not None else None
    warn_exposure(settings)
    scheme = "https" if settings.tls_cert else "http"
    # The sign-in link is a secret too: shown to a person at a terminal, not to a log collector.
    on_terminal = (sys.stdout if as_json else sys.stderr).isatty()

    def on_ready(settings: Settings, token: str, link: str | None, reconciled: list[Any]) -> None:
        from .. import tokenfile

        token_file = str(tokenfile.token_file(settings.data_dir, settings.port))
        url = f"{scheme}://{url_host(settings.host)}:{settings.port}"
        console = link or f"{url}/ui/"
        if as_json:
            announced = {
                "url": url, "token_file": token_file, "database_url": redact(settings.database_url),
                "app": app_spec, "executor": not no_executor, "console": console, "dev": dev, "workers": workers,
                "subscriptions": [r.to_dict() for r in reconciled],
            }
            if print_token:
                announced["token"] = token
            emit(announced, True, str)
            sys.stdout.flush()
            return
        notes = []
        if workers > 1:
            notes.append(f"workers:      {workers} server processes share this port")
        if dev:
            notes.append("authentication is OFF (--dev): requests without a token act as tenant default with"
                         " every scope")
        if app is not None:
            mode = "API only (no executor: run `yoke worker`)" if no_executor else "running its actors here"
            notes.append(f"app:          {app_spec}: {describe_app(app)}; {mode}")
            notes.extend(subscription_notes(reconciled))
        elif no_executor:
            notes.append("no executor:  appends are stored without fan-out")
        if settings.log_format == "json":  # every line on stderr is a JSON log line
            log.info("Yoke is serving %s at %s (API docs: %s/docs); admin token in %s; console: %s",
                     redact(settings.database_url), url, url, token_file, console)
            for note in notes:
                log.info("%s", " ".join(note.split()))
            return
        print_banner(settings, url, token if print_token else None, token_file, console, link is not None)
        for note in notes:
            click.echo(f"  {note}\n", err=True)

    def serve_one(announce: bool, on_stop: Callable[[], None] | None = None) -> None:
        from ..errors import YokeError

        try:
            with tracing_installed(settings, "serve"):
                run_server(settings, app=app, executor=not no_executor, on_ready=on_ready if announce else None,
                           sock=sock, dev=dev, announce=announce, on_stop=on_stop,
                           sign_in_link=print_token or on_terminal, rotate_token=rotate_token)
        except YokeError as exc:  # the runtime did not open: the schema, the roles, the state's home
            fail(f"{redact(settings.database_url)}: {exc.code}: {exc.message}")

    if workers == 1:
        serve_one(True)
        return
    from ..http.workers import serve_forked

    serve_forked(workers, serve_one)


def subscription_notes(reconciled: list[Any]) -> list[str]:
    """The banner's lines for the app's declared subscriptions: one per
    outcome (created, unchanged, changed, undeclared, removed) naming them."""
    by_outcome: dict[str, list[str]] = {}
    for r in reconciled:
        where = r.path if r.tenant == "default" else f"{r.tenant}:{r.path}"
        by_outcome.setdefault(r.outcome, []).append(f"{r.name} ({where})")
    notes = [f"subscriptions {outcome}: {', '.join(names)}" for outcome, names in by_outcome.items()]
    if "undeclared" in by_outcome:
        notes.append("  (undeclared: no longer in the app, still delivering;"
                     " YOKE_REMOVE_UNDECLARED_SUBSCRIPTIONS=1 removes them)")
    return notes


def warn_exposure(settings: Settings) -> None:
    """Warn about a server others can reach in ways its settings do not cover."""
    from ..http.metrics_access import MetricsAccess
    from ..http.server import is_loopback

    if not is_loopback(settings.host) and not settings.tls_cert and not settings.proxy_headers:
        log.warning(
            "listening on %s without TLS: tokens, events and the console's cookie cross the network in clear;"
            " serve HTTPS (--tls-cert/--tls-key) or put a TLS proxy in front (--proxy-headers)", settings.host,
        )
    closed = MetricsAccess.of(settings, settings.host, behind_proxy=settings.proxy_headers).closed_reason
    if closed:
        log.warning("%s", closed)


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


def print_banner(
    settings: Settings, url: str, token: str | None, token_file: str, console: str, signs_in: bool,
) -> None:
    auth = f'-H "Authorization: Bearer $(cat {token_file})"'
    cli = cli_name() + " read /demo" + ("" if settings.port == 8080 else f" --url {url}")
    if token is not None:
        token_line = f"{token}   (saved in {token_file})"
    else:
        token_line = f"in {token_file}   (mode 0600; --print-token prints it)"
    if "#code=" in console:
        console_line = f"{console}   (signs a browser in, once)"
    elif signs_in:  # a link without a code: --dev
        console_line = f"{console}   (no sign-in: --dev)"
    else:
        console_line = f"{console}   (sign in with a token; a one-time link is printed on a terminal)"
    click.echo(
        f"""
Yoke is serving {redact(settings.database_url)}
  URL:          {url}   (API docs: {url}/docs)
  admin token:  {token_line}
  console:      {console_line}

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
@click.option(
    "--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
    help="Serve /metrics (and /healthz) on this port: the worker's actor and subscription series"
         " (default none; YOKE_METRICS_PORT).",
)
@click.option(
    "--metrics-host", default=None, metavar="HOST",
    help="Address of the /metrics port (default 127.0.0.1; off loopback it needs YOKE_METRICS_TOKEN"
         " or YOKE_METRICS_PUBLIC=1; YOKE_METRICS_HOST).",
)
@ISOLATION_OPTION
@RELOAD_OPTION
@NO_MIGRATE_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
@TRACING_OPTION
@JSON_OPTION
def worker(
    database_url: str | None, app_spec: str, metrics_port: int | None, metrics_host: str | None,
    isolation: str | None, reload: bool | None, no_migrate: bool | None, log_level: str | None,
    log_format: str | None, tracing: str | None, as_json: bool,
) -> None:
    """Run the application's actors without HTTP (fan-out, scheduler,
    schedules, portal loops) until SIGTERM/SIGINT, then stop gracefully:
    runs in progress finish (up to YOKE_SHUTDOWN_TIMEOUT_S), queued appends
    commit, and the worker's instances pass to the other workers. With
    --metrics-port, /metrics on that port. With --json, a JSON line on
    stdout once it runs."""
    import asyncio

    from ..errors import YokeError

    settings = settings_or_fail(
        "worker", database_url=database_url, isolation=isolation, reload=reload or None,
        migrate=False if no_migrate else None, log_level=log_level, log_format=log_format,
        metrics_port=metrics_port, metrics_host=metrics_host, tracing=tracing,
    )
    setup_logging(settings)
    descriptors.raise_soft_limit()  # instance databases: three descriptors each
    sock = None
    if settings.metrics_port:
        from ..http.server import bind_socket

        try:  # before anything is loaded or announced
            sock = bind_socket(settings.metrics_host, settings.metrics_port)
        except OSError as exc:
            fail(listen_failure(exc, settings.metrics_host, settings.metrics_port, "--metrics-port"))
    app = load_app_or_fail(app_spec)
    try:
        with tracing_installed(settings, "worker"):
            asyncio.run(_work(settings, app, app_spec, as_json, sock))
    except KeyboardInterrupt:  # a second signal while stopping
        sys.exit(130)
    except YokeError as exc:  # the schema, the roles: the message says what to do
        fail(f"{redact(settings.database_url)}: {exc.code}: {exc.message}")
    except Exception as exc:  # an unreachable or missing database, a bad URL
        fail(f"{redact(settings.database_url)}: {type(exc).__name__}: {exc}")


async def _work(settings: Settings, app: Any, app_spec: str, as_json: bool, sock: socket.socket | None) -> None:
    import asyncio

    from .. import metrics
    from ..runtime import open as open_runtime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with open_runtime(settings=settings, app=app) as runtime, contextlib.AsyncExitStack() as stack:
        heap.settle()
        metrics_url = None
        if sock is not None:
            from ..http.addresses import url_host
            from ..http.metrics_server import MetricsServer

            metrics.announce_build()
            sampler = runtime.sampler()  # the database-sampled gauges, in the background
            sampler.start()
            stack.push_async_callback(sampler.stop)
            server = MetricsServer.of(runtime)
            await server.start(sock)
            stack.push_async_callback(server.stop)
            metrics_url = f"http://{url_host(server.host)}:{server.port}/metrics"
            if server.closed_reason:
                log.warning("%s", server.closed_reason)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if as_json:
            emit({"worker_id": runtime.worker_id, "database_url": redact(settings.database_url), "app": app_spec,
                  "metrics_url": metrics_url,
                  "subscriptions": [r.to_dict() for r in runtime.subscriptions_reconciled]}, True, str)
            sys.stdout.flush()
        log.info(
            "yoke worker %s on %s: %s: %s%s (SIGTERM or Ctrl-C to stop)",
            runtime.worker_id, redact(settings.database_url), app_spec, describe_app(app),
            f"; metrics at {metrics_url}" if metrics_url else "",
        )
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)  # a second signal ends the process at once
            log.info("yoke worker %s: stopping", runtime.worker_id)
    log.info("yoke worker: stopped")


class MigrateCommand(SettingsCommand):
    pass


@command(cls=MigrateCommand, short_help="Apply pending database migrations now; --status reports them.")
@DB_OPTION
@click.option("--status", "show_status", is_flag=True,
              help="Change nothing: list the migrations applied, pending, and recorded by a newer build.")
@click.option("--print-grants", is_flag=True,
              help="Change nothing: print the SQL that gives the runtime role (YOKE_PG_ROLE) what it needs"
                   " on this (migrated) PostgreSQL database.")
@JSON_OPTION
def migrate(database_url: str | None, show_status: bool, print_grants: bool, as_json: bool) -> None:
    """Apply pending database migrations now. Servers and workers also
    migrate when they start, unless --no-migrate.

    On PostgreSQL, as the database's owner, it also creates the runtime role
    (YOKE_PG_ROLE, default yoke_runtime) when missing, sets its password from
    YOKE_PG_ROLE_PASSWORD when given, and grants it what the runtime needs
    (docs/production/roles.md). A database migrated by a newer Yoke is
    refused (exit 1)."""
    import asyncio

    settings = settings_or_fail("migrate", database_url=database_url)
    url = settings.database_url
    postgres = url.startswith(("postgresql://", "postgres://"))
    if print_grants and not postgres:
        fail("--print-grants is for PostgreSQL (SQLite has no roles)")
    if show_status:
        found = _migration_status(settings, postgres)
        emit(
            {"database_url": redact(url), "build": _build(), "applied": found.applied, "pending": found.pending,
             "newer": found.newer},
            as_json, lambda v: _status_text(v),
        )
        return
    if not postgres:
        from .tokens import run_or_fail

        run_or_fail(settings, lambda y: asyncio.sleep(0))
        emit({"database_url": url, "applied": []}, as_json, lambda v: f"{url}: up to date")
        return
    from ..errors import YokeError

    try:
        done = asyncio.run(_migrate_postgres(settings, print_grants))
    except YokeError as exc:
        fail(f"{redact(url)}: {exc.code}: {exc.message}")
    except Exception as exc:  # an unreachable or missing database
        fail(f"{redact(url)}: {type(exc).__name__}: {exc}")
    if print_grants:
        emit({"database_url": redact(url), "role": settings.pg_role, "statements": done}, as_json,
             lambda v: "\n".join(f"{statement};" for statement in done))
        return
    applied, role = done
    emit(
        {"database_url": redact(url), "applied": applied, "role": settings.pg_role, "role_statements": role},
        as_json,
        lambda v: "\n".join([*(f"applied {name}" for name in applied), *(f"{s};" for s in role)])
        or "schema up to date",
    )


def _build() -> str:
    from ..build import build

    return build()


def _migration_status(settings: Settings, postgres: bool) -> Any:
    import asyncio

    from ..errors import YokeError

    try:
        if not postgres:
            from ..store.sqlite.connection import file_migration_status

            return file_migration_status(settings.database_url)
        return asyncio.run(_postgres_status(settings))
    except YokeError as exc:
        fail(f"{redact(settings.database_url)}: {exc.code}: {exc.message}")
    except Exception as exc:  # an unreachable or missing database
        fail(f"{redact(settings.database_url)}: {type(exc).__name__}: {exc}")


async def _postgres_status(settings: Settings) -> Any:
    from ..store.postgres.connection import connect
    from ..store.postgres.migrate import status

    conn = await connect(settings.database_url, timeout_s=settings.pg_connect_timeout_s,
                         server_settings={"application_name": settings.pg_application_name})
    try:
        return await status(conn)
    finally:
        await conn.close()


def _status_text(v: dict[str, Any]) -> str:
    def names(found: list[str]) -> str:
        return ", ".join(found) if found else "none"

    newest = v["applied"][-1] if v["applied"] else "none"
    lines = [
        f"database:   {v['database_url']}",
        f"this build: yoke {v['build']}",
        f"applied:    {len(v['applied'])} (newest {newest})",
        f"pending:    {names(v['pending'])}",
        f"newer:      {names(v['newer'])}",
    ]
    if v["newer"]:
        lines.append("a newer Yoke migrated this database: this build refuses to start on it")
    elif v["pending"]:
        lines.append("`yoke migrate` applies the pending ones")
    return "\n".join(lines)


async def _migrate_postgres(settings: Settings, print_grants: bool) -> Any:
    """Migrate (and as the owner, sync the runtime role); or the grants'
    statements alone."""
    import asyncpg

    from ..store.postgres.connection import connect
    from ..store.postgres.migrate import grant_statements, migrate, privilege_hint, sync_role
    from ..store.postgres.store import rls_escape

    conn = await connect(settings.database_url, timeout_s=settings.pg_connect_timeout_s,
                         server_settings={"application_name": settings.pg_application_name})
    try:
        if print_grants:
            return await grant_statements(conn, settings.pg_role)
        try:
            applied = await migrate(conn)
            role: list[str] = []
            if await rls_escape(conn) is not None:  # the owner, or a login above it
                role = await sync_role(conn, settings.pg_role, settings.pg_role_password, set_password=True)
        except asyncpg.InsufficientPrivilegeError as exc:
            from ..errors import DatabasePrivileges

            raise DatabasePrivileges(await privilege_hint(conn, exc)) from exc
        return applied, role
    finally:
        await conn.close()
