"""``yoke demo``: a first look, in-process, without a server."""

from __future__ import annotations


import click

from .common import DB_OPTION, JSON_OPTION, command, compact
from .streams import event_line, events_header


@command(short_help="Append, read and tail a stream in-process: a first look, no server.")
@DB_OPTION
@JSON_OPTION
def demo(database_url: str | None, as_json: bool) -> None:
    """Start here: append, read and tail the stream /demo/orders through the
    Python API, in this process (no server; the database is
    ./.yoke/yoke.db unless --db). With --json, the tailed events as JSON
    lines."""
    import asyncio
    asyncio.run(_demo(database_url, as_json))


async def _demo(database_url: str | None, as_json: bool) -> None:
    import yoke

    def say(text: str) -> None:
        if not as_json:
            click.echo(text)

    async with yoke.open(database_url) as y:
        say(f"Yoke {yoke.__version__} on {y.settings.database_url}")
        orders = y.stream("/demo/orders")
        try:
            start = (await orders.info()).head
        except yoke.StreamNotFound:
            start = 0
        tail_events = orders.tail(after=start)
        results = await orders.append_many(
            [{"type": "order.placed", "payload": {"order": n, "qty": n}} for n in (1, 2, 3)]
        )
        say(f"appended 3 events to /demo/orders at offsets {[r.offset for r in results]} (one transaction),")
        await orders.append({"type": "order.progress", "payload": {"pct": 50}, "ephemeral": True})
        await orders.append({"type": "order.shipped", "payload": {"order": 1}})
        say("an ephemeral order.progress (never stored) and an order.shipped; a tail from offset "
            f"{start} sees them all:\n")
        say(events_header())
        count = 0
        async for event in tail_events:
            click.echo(compact(event.to_dict()) if as_json else event_line(event.to_dict()))
            count += 1
            if count == 5:
                break
        await tail_events.aclose()
    say(
        "\nNext: `yoke serve` serves the HTTP API (in Yoke's checkout, `make run` serves the example order"
        " pipeline); then `yoke read /demo/orders` and `yoke --help` (the README has the tour)."
    )
