"""``yoke tokens create|list|revoke``: API tokens, managed on the database
directly (a tenant's first token cannot come from that tenant)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .common import Column, DB_OPTION, JSON_OPTION, argument, emit, fail, group, or_dash, table, when

if TYPE_CHECKING:
    from ..config import Settings

TENANT_OPTION = click.option(
    "--tenant", default="default", show_default=True, metavar="TENANT", help="The tenant the tokens belong to."
)


async def _with_runtime(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from ..runtime import open as open_runtime

    async with open_runtime(settings=settings, executor=False) as y:  # no deliveries from here
        return await action(y)


def run_or_fail(settings: Settings, action: Callable[[Any], Any]) -> Any:
    """``action(runtime)`` on the database, failures as one error line."""
    import asyncio
    from ..errors import YokeError
    from .server import redact

    try:
        return asyncio.run(_with_runtime(settings, action))
    except YokeError as exc:
        fail(f"{exc.code}: {exc.message}")
    except Exception as exc:  # an unreachable or missing database, a bad URL
        fail(f"{redact(settings.database_url)}: {type(exc).__name__}: {exc}")


TOKEN_COLUMNS: list[Column] = [
    ("TOKEN ID", lambda t: t["token_id"], "<"),
    ("TENANT", lambda t: t["tenant"], "<"),
    ("SCOPES", lambda t: ",".join(t["scopes"]), "<"),
    ("CREATED", lambda t: when(t["created_at"]), "<"),
    ("STATE", lambda t: state(t), "<"),
    ("NAME", lambda t: or_dash(t["name"]), "<"),
]


def state(token: dict[str, Any]) -> str:
    if token["revoked"]:
        return f"revoked {when(token['revoked_at'])}"
    expires = token.get("expires_at")
    if expires is None:
        return "active"
    return f"expired {when(expires)}" if expires <= time.time() * 1000 else f"active, expires {when(expires)}"


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``3600s`` or ``3600`` as seconds."""
    value, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    if not value.isdigit() or int(value) == 0:
        raise click.BadParameter(f"{text!r}: a positive whole number with s, m, h or d, like 30d")
    return int(value) * DURATION_UNITS[unit]


@group(short_help="Create, list and revoke API tokens (on the database).")
def tokens() -> None:
    """Create, list and revoke API tokens (on the database: --db or
    YOKE_DATABASE_URL, the same one the server uses)."""


@tokens.command("create", short_help="Create a token; prints it once.")
@DB_OPTION
@TENANT_OPTION
@click.option("--scopes", default="read,append", show_default=True, metavar="SCOPES",
              help="Comma-separated: read, append, admin (admin includes the others).")
@click.option("--name", default="", metavar="NAME", help="A label for the token.")
@click.option("--expires", "expires", default=None, metavar="DURATION",
              help="Refused (token_expired) after this long: 30d, 12h, 90m or seconds (default: never).")
@JSON_OPTION
def tokens_create(
    database_url: str | None, tenant: str, scopes: str, name: str, expires: str | None, as_json: bool,
) -> None:
    """Create a token and print it (it is shown only this once): the token
    alone on stdout, so that TOKEN=$(yoke tokens create ...) works; its id
    and scopes on stderr."""
    from .server import settings_or_fail

    settings = settings_or_fail(database_url=database_url)
    expires_in_s = None if expires is None else parse_duration(expires)

    async def create(y: Any) -> Any:
        return await y.tokens.create(
            tenant, [s.strip() for s in scopes.split(",") if s.strip()], name, expires_in_s=expires_in_s
        )

    new = run_or_fail(settings, create)
    if as_json:
        emit({"token": new.token, **new.info.to_dict()}, True, str)
        return
    click.echo(new.token)
    until = "" if new.info.expires_at is None else f", expires {when(new.info.expires_at)}"
    click.echo(
        f"(token id {new.info.token_id}, tenant {tenant}, scopes {','.join(new.info.scopes)}{until}; shown once:"
        " pass it with --token or YOKE_TOKEN)",
        err=True,
    )


@tokens.command("list")
@DB_OPTION
@TENANT_OPTION
@JSON_OPTION
def tokens_list(database_url: str | None, tenant: str, as_json: bool) -> None:
    """List a tenant's tokens, revoked ones included (never the secrets)."""
    from .server import settings_or_fail

    settings = settings_or_fail(database_url=database_url)
    listed = [t.to_dict() for t in run_or_fail(settings, lambda y: y.tokens.list(tenant))]
    emit(listed, as_json, lambda v: table(v, TOKEN_COLUMNS, f"(no tokens in tenant {tenant})"))


@tokens.command("revoke", short_help="Revoke a token.")
@DB_OPTION
@argument("token_id", "the id of a token, like tok_0123456789abcdef (see `yoke tokens list`)")
@TENANT_OPTION
@JSON_OPTION
def tokens_revoke(database_url: str | None, token_id: str, tenant: str, as_json: bool) -> None:
    """Revoke a token: refused at once by the server it was used on, within
    2 s by the others."""
    from .server import settings_or_fail

    settings = settings_or_fail(database_url=database_url)
    if not run_or_fail(settings, lambda y: y.tokens.revoke(tenant, token_id)):
        fail(f"no active token {token_id} in tenant {tenant} (`yoke tokens list --tenant {tenant}`)")
    emit({"revoked": token_id, "tenant": tenant}, as_json, lambda v: f"revoked {token_id}")
