"""What every command group shares: click classes that give arguments help
and say what a missing argument should be, output helpers (JSON, aligned
tables, readable values), the database option, and ``http_command``, which
gives a command ``--url/--token/--tenant/--json`` and turns every failure
into one ``error: ...`` line that says how to fix it.

Imports here stay light (click and the standard library): ``yoke --help``
loads every command module, and a command pays for the runtime, the HTTP
stack or a database driver only when it needs them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, NoReturn

import click

from ..client import DEFAULT_URL, Client, ClientError, dumps, url_port

# --- click classes -----------------------------------------------------------------


class Arg(click.Argument):
    """An argument with ``help``: listed in ``--help``, and named with what
    is expected when it is missing."""

    def __init__(self, param_decls: Sequence[str], help: str = "", **attrs: Any) -> None:  # noqa: A002
        super().__init__(param_decls, **attrs)
        self.help = help  # after: click >= 8.5 sets its own (None)

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        try:
            return super().process_value(ctx, value)
        except click.MissingParameter as exc:
            if not exc.message and self.help and not isinstance(self.type, click.Choice):
                exc.message = f"Expected {self.help}."
            raise


class Command(click.Command):
    """A command whose arguments have help (click >= 8.5 lists them itself
    under "Positional arguments")."""

    if not hasattr(click.Command, "format_arguments"):

        def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            rows = [(p.make_metavar(ctx), p.help) for p in self.get_params(ctx) if isinstance(p, Arg) and p.help]
            if rows:
                with formatter.section("Positional arguments"):
                    formatter.write_dl(rows)
            super().format_options(ctx, formatter)


class Group(click.Group):
    """Subcommands in the order they were added (related ones together)."""

    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


Group.group_class = Group


def command(name: str | None = None, **attrs: Any) -> Callable[[Any], Command]:
    """``click.command`` making a ``Command``."""
    attrs.setdefault("cls", Command)
    return click.command(name, **attrs)


def group(name: str | None = None, **attrs: Any) -> Callable[[Any], Group]:
    attrs.setdefault("cls", Group)
    return click.group(name, **attrs)


def argument(name: str, help: str, **attrs: Any) -> Callable[[Any], Any]:  # noqa: A002
    """``click.argument`` with help; the metavar is the name in capitals
    (``TYPE`` for ``type_``), in brackets when optional."""
    metavar = name.rstrip("_").upper()
    optional = attrs.get("required") is False or "default" in attrs
    attrs.setdefault("metavar", f"[{metavar}]" if optional else metavar)
    return click.argument(name, cls=Arg, help=help, **attrs)


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON (one document, or one per line) for scripts.")

DB_OPTION = click.option(
    "--db",
    "database_url",
    envvar="YOKE_DATABASE_URL",
    show_envvar=True,
    default=None,
    metavar="URL",
    help="Database: sqlite:///path.db (default sqlite:///./.yoke/yoke.db) or postgresql://...",
)

PATH_HELP = "a stream path, like /orders (/ is the tenant's global stream)"

# --- output ----------------------------------------------------------------------


def fail(message: str, status: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def emit(value: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    click.echo(dumps(value) if as_json else human(value))


def compact(value: Any) -> str:
    """A JSON value on one line: ``{"id":7}``."""
    return dumps(value)


def yes_no(value: Any) -> str:
    return "yes" if value else "no"


def when(ms: int | None) -> str:
    """Milliseconds since the epoch as local time, ``2025-06-01 12:00:05``."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def or_dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


Column = tuple[str, Callable[[dict[str, Any]], Any], str]  # header, value, "<" or ">"


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], empty: str, min_widths: Sequence[int] = ()
) -> str:
    """Aligned columns under a header row; ``empty`` when there are no rows."""
    if not rows:
        return empty
    header = [name for name, _, _ in columns]
    cells = [[str(get(row)) for _, get, _ in columns] for row in rows]
    widths = [
        max(len(header[i]), *(len(line[i]) for line in cells), min_widths[i] if i < len(min_widths) else 0)
        for i in range(len(columns))
    ]
    return "\n".join(table_line(line, widths, columns) for line in [header, *cells])


def table_line(values: Sequence[str], widths: Sequence[int], columns: Sequence[Column]) -> str:
    """One row; the last column is not padded."""
    parts = []
    for i, (value, width, (_, _, align)) in enumerate(zip(values, widths, columns)):
        if align == ">":
            parts.append(f"{value:>{width}}")
        elif i == len(columns) - 1:
            parts.append(value)
        else:
            parts.append(f"{value:<{width}}")
    return "  ".join(parts).rstrip()


def parse_json(text: str, what: str) -> Any:
    from ..client import loads

    try:
        return loads(text)
    except ValueError as exc:
        fail(f"{what} is not valid JSON: {exc}")


# --- commands over HTTP ------------------------------------------------------------


class Remote(Client):
    """The client a command gets: a ``Client`` that also knows where its
    token came from, for the error messages."""

    def __init__(self, url: str, token: str | None, tenant: str | None, token_source: str | None,
                 token_file: str | None) -> None:
        super().__init__(url, token, tenant=tenant)
        self.token_source = token_source  # "--token", "$YOKE_TOKEN", a file, or None
        self.token_file = token_file  # the file a server on this port would write

    def tenant_label(self) -> str:
        if self.tenant is not None:
            return f"tenant {self.tenant}"
        if self.token_source is not None and self.token_source not in ("--token", "$YOKE_TOKEN"):
            return "tenant default"  # token files hold the admin token of tenant default
        return "the token's tenant"


def resolve_token(url: str, token: str | None) -> tuple[str | None, str | None, str]:
    """(token, where it came from, the token file of ``url``'s port)."""
    from .. import tokenfile

    path = tokenfile.token_file(tokenfile.data_dir(), url_port(url))
    shown = os.path.relpath(path) if not path.is_absolute() else str(path)
    if token:
        return token, "--token", shown
    if os.environ.get("YOKE_TOKEN"):
        return os.environ["YOKE_TOKEN"], "$YOKE_TOKEN", shown
    found = tokenfile.read_token(path)
    return found, (shown if found else None), shown


def explain(exc: ClientError, remote: Remote) -> str:
    """One line for an error answer, with the fix when we know it."""
    error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
    head = f"{exc.code} ({exc.status})"
    if exc.status == 401:
        if remote.token_source is None:
            return (
                f"{head}: no token for {remote.url}: {remote.token_file} does not exist (`yoke serve --port "
                f"{remote.port}` writes it when started in this directory); pass --token or set YOKE_TOKEN"
            )
        if remote.token_source == "--token":
            return f"{head}: {remote.url} refused the token given with --token ({exc.message})"
        if remote.token_source == "$YOKE_TOKEN":
            return (
                f"{head}: {remote.url} refused the token in $YOKE_TOKEN ({exc.message}); set it to a valid "
                f"token, or unset it to use {remote.token_file}"
            )
        return (
            f"{head}: {remote.url} refused the token in {remote.token_source} ({exc.message}): a server on "
            f"another database wrote it, or it was revoked; restart `yoke serve --port {remote.port}` in this "
            "directory to renew it, or pass --token / set YOKE_TOKEN"
        )
    if exc.status == 403 and "scope" not in error and remote.tenant is not None:
        source = remote.token_source or "the token"
        return (
            f"{head}: the token from {source} belongs to another tenant than {remote.tenant}; make one with "
            f"`yoke tokens create --tenant {remote.tenant} --scopes read,append` and pass it with --token "
            "or YOKE_TOKEN"
        )
    if exc.code == "stream_not_found":
        path = error.get("path", "")
        hint = "" if remote.tenant is not None else ", or name another tenant with --tenant T"
        return f"{head}: no stream {path} in {remote.tenant_label()}; `yoke streams` lists them{hint}"
    return str(exc)


def transport_failure(exc: OSError, url: str, timeout: float) -> str:
    import http.client
    import socket

    if isinstance(exc, ConnectionRefusedError):
        return (
            f"no Yoke server at {url}; start one with `make run` or `yoke serve` "
            "(another port: --port N), or point --url (or YOKE_URL) at a running one"
        )
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {url}: {exc.strerror or exc}"
    if isinstance(exc, TimeoutError):
        return f"{url} did not answer within {timeout:g} s"
    if isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError)):
        return f"{url} closed the connection without an answer (is it a Yoke server? is it stopping?)"
    return f"cannot reach {url}: {exc}"


def http_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --url/--token/--tenant/--json; the command gets a ``Remote``."""

    @click.option(
        "--url", envvar="YOKE_URL", show_envvar=True, default=DEFAULT_URL, show_default=True, metavar="URL",
        help="The Yoke server to talk to.",
    )
    @click.option(
        "--token", default=None, metavar="TOKEN",
        help="Bearer token (default: $YOKE_TOKEN, else the token file .yoke/token-PORT that "
        "`yoke serve` wrote for the port of --url).",
    )
    @click.option(
        "--tenant", default=None, metavar="TENANT",
        help="Act in this tenant (default: the token's). The token must belong to it.",
    )
    @JSON_OPTION
    @wraps(fn)
    def wrapper(url: str, token: str | None, tenant: str | None, as_json: bool, **kwargs: Any) -> None:
        token, source, token_file = resolve_token(url, token)
        try:
            remote = Remote(url, token, tenant, source, token_file)
        except ValueError as exc:
            fail(f"--url: {exc}")
        try:
            fn(remote, as_json, **kwargs)
        except ClientError as exc:
            fail(explain(exc, remote))
        except OSError as exc:
            fail(transport_failure(exc, url, remote.timeout))

    return wrapper


# --- settings -----------------------------------------------------------------------


class SettingsCommand(Command):
    """A command configured by ``Settings``: its help ends with every YOKE_*
    variable it reads (computed when the help is shown, so that ``yoke``
    itself starts without importing the settings)."""

    extra_env: Sequence[tuple[str, str]] = ()

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from dataclasses import MISSING, fields

        from ..config import Settings

        rows = list(self.extra_env)
        for f in fields(Settings):
            default = f.default if f.default is not MISSING else None
            shown = "(none)" if default in ("", None) else str(default).lower() if isinstance(default, bool) else str(default)
            rows.append((f"YOKE_{f.name.upper()}", shown))
        with formatter.section("Environment (flags win; docs/production/configuration.md explains each)"):
            formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)
