"""The ``yoke`` command line."""

from __future__ import annotations

import asyncio
import sys

import click

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


@main.command()
@DB_OPTION
def migrate(database_url: str | None) -> None:
    """Apply pending database migrations (PostgreSQL; SQLite migrates on open)."""
    settings = Settings.from_env(database_url=database_url)
    url = settings.database_url
    if url.startswith("sqlite:///"):
        asyncio.run(_open_and_close(settings))
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

    applied = asyncio.run(run())
    for name in applied:
        click.echo(f"applied {name}")
    if not applied:
        click.echo("schema up to date")


async def _open_and_close(settings: Settings) -> None:
    from .runtime import Runtime

    runtime = Runtime(settings)
    await runtime.start()
    await runtime.close()


@main.command()
@DB_OPTION
def demo(database_url: str | None) -> None:
    """Append, read and tail a stream through the Python API."""
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
        tail = orders.tail(after=start)
        results = await orders.append_many(
            [{"type": "order.placed", "payload": {"order": n, "qty": n}} for n in (1, 2, 3)]
        )
        click.echo(f"appended offsets {[r.offset for r in results]}")
        await orders.append({"type": "order.progress", "payload": {"pct": 50}, "ephemeral": True})
        await orders.append({"type": "order.shipped", "payload": {"order": 1}})
        click.echo("tail (backfill, then live):")
        count = 0
        async for event in tail:
            marker = " (ephemeral)" if event.ephemeral else ""
            click.echo(f"  {event.offset:>5}  {event.type:<16} {event.payload}{marker}")
            count += 1
            if count == 5:
                break
        await tail.aclose()
        info = await orders.info()
        click.echo(f"stream {info.path}: id {info.stream_id}, head {info.head}")


if __name__ == "__main__":
    sys.exit(main())
