#!/usr/bin/env python
"""Virtual time: how many real seconds the test environment (yoke.testing)
takes to move through time that production would wait out.

Per backend (SQLite, and PostgreSQL on a scratch database made through
``YOKE_BENCH_PG_URL``, default postgresql://postgres@127.0.0.1:5432/postgres):

(a) a reminder scheduled a week out: ``advance(days=7)`` until it fired;
(b) a daily cron across a month: ``advance(days=31)``, 31 firings;
(c) a webhook receiver failing every post: ``until`` under auto-advance
    walks the retry ladder (1 s doubling to 30 min, 15 attempts, about
    two and a half hours) until the subscription halts;
(d) an actor failing every run (5 attempts, backoff from 60 s): until its
    dead letter.

Each is run ``--runs`` times (default 3) on a fresh environment; the median
and the range of real seconds are printed. Targets (the issue's): (a) well
under 1 s; (c) under 5 s.

Run: ``.venv/bin/python bench/virtual_time.py [--runs N] [--backend sqlite|postgres|both]``
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from yoke import App, Filter
from yoke.subscriptions.receivers import from_dict
from yoke.testing import Environment, WebhookReceiver, env

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

app = App(name="bench-virtual-time")


@app.actor("reminder", filter=Filter(types=["remind"], key="payload.who"))
async def reminder(ctx, event):  # noqa: ANN001, ANN201
    if event.type == "remind":
        await ctx.schedules.upsert("r", after_s=7 * 86400, event={"type": "due", "payload": {}})
    else:
        await ctx.state.set({"fired": ctx.now().isoformat()})


@app.actor("ticker", filter=Filter(types=["start"], key="payload.name"))
async def ticker(ctx, event):  # noqa: ANN001, ANN201
    if event.type == "start":
        await ctx.schedules.upsert("daily", cron="0 6 * * *", event={"type": "tick", "payload": {}})
    await ctx.state.update(lambda s: (s or 0) + (event.type == "tick"), default=0)


@app.actor("flaky", filter=Filter(types=["job"], key="payload.id"), max_attempts=5, retry_base_s=60)
async def flaky(ctx, event):  # noqa: ANN001, ANN201
    raise RuntimeError("down")


async def week(e: Environment) -> None:
    await e.y.stream("/").append({"type": "remind", "payload": {"who": "ann"}})
    await e.advance(days=7)
    assert (await e.state("reminder", "ann")) is not None


async def month(e: Environment) -> None:
    await e.y.stream("/").append({"type": "start", "payload": {"name": "t"}})
    await e.advance(days=31)
    assert await e.state("ticker", "t") == 31


async def ladder(e: Environment) -> None:
    async with WebhookReceiver() as receiver:
        receiver.fail_all(500)
        out = e.y.stream("/out")
        await out.subscribe("hook", from_dict({"kind": "webhook", "url": receiver.url}), start="beginning")
        await out.append({"type": "x", "payload": {}})

        async def halted() -> bool:
            return (await e.subscription("/out", "hook")).state == "halted"

        async with e.auto_advance():
            await e.until(halted)
        assert len(receiver.posts) == 15


async def dead_letter(e: Environment) -> None:
    await e.y.stream("/").append({"type": "job", "payload": {"id": "j"}})
    async with e.auto_advance():
        await e.until(lambda: e.dead_letters("flaky", "j"))


async def timed(scenario: Callable[[Environment], Awaitable[None]], postgres: bool) -> float:
    async with env(app, start=START, postgres=postgres) as e:
        started = time.perf_counter()
        await scenario(e)
        return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    os.environ.setdefault("YOKE_TEST_PG_URL", os.environ.get("YOKE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    scenarios = [("(a) a week, one schedule", week), ("(b) a month of a daily cron", month),
                 ("(c) a webhook's retry ladder to its halt", ladder), ("(d) an actor's backoff to its dead letter", dead_letter)]
    print(f"{'scenario':45} {'backend':9} real seconds: median (min-max) of {args.runs}")
    for name, scenario in scenarios:
        for backend in backends:
            took = [await timed(scenario, backend == "postgres") for _ in range(args.runs)]
            print(f"{name:45} {backend:9} {statistics.median(took):.3f} ({min(took):.3f}-{max(took):.3f})")


if __name__ == "__main__":
    asyncio.run(main())
