"""``yoke tokens create|list|revoke``: API tokens, managed on the database
directly (a tenant's first token cannot come from that tenant)."""

from __future__ import annotations

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
    ("STATE", lambda t: f"revoked {when(t['revoked_at'])}" if t["revoked"] else "active", "<"),
    ("NAME", lambda t: or_dash(t["name"]), "<"),
]


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
@JSON_OPTION
def tokens_create(database_url: str | None, tenant: str, scopes: str, name: str, as_json: bool) -> None:
    """Create a token and print it (it is shown only this once): the token
    alone on stdout, so that TOKEN=$(yoke tokens create ...) works; its id
    and scopes on stderr."""
    from .server import settings_or_fail

    settings = settings_or_fail(database_url=database_url)

    async def create(y: Any) -> Any:
        return await y.tokens.create(tenant, [s.strip() for s in scopes.split(",") if s.strip()], name)

    new = run_or_fail(settings, create)
    if as_json:
        emit({"token": new.token, **new.info.to_dict()}, True, str)
        return
    click.echo(new.token)
    click.echo(
        f"(token id {new.info.token_id}, tenant {tenant}, scopes {','.join(new.info.scopes)}; shown once: "
        "pass it with --token or YOKE_TOKEN)",
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
