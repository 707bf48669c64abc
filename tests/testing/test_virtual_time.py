"""yoke.testing: the real runtime under a virtual clock. Schedules a week
out, a month of cron, an actor's backoff to its dead letter, a webhook's
whole retry ladder, retention and a Durable Streams TTL, ctx.now() in host
processes, and the same history on every run, each in real seconds."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from yoke import errors
from yoke.subscriptions.receivers import from_dict
from yoke.testing import WebhookReceiver, env

from .app import app

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def iso(moment: dt.datetime) -> str:
    return moment.isoformat()


@pytest.fixture(params=["sqlite", "postgres"])
def postgres(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "postgres":
        from ..conftest import PG_ADMIN_URL

        monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    return request.param == "postgres"


async def test_a_reminder_a_week_out_fires_after_seven_days_and_not_before(postgres: bool) -> None:
    async with env(app, start=START, postgres=postgres) as e:
        started = time.monotonic()
        await e.y.stream("/").append({"type": "reminder.requested", "payload": {"who": "ann"}})
        await e.advance(days=6, hours=23, minutes=59, seconds=59)
        assert await e.state("reminder", "ann") == {"requested_at": iso(START), "fired_at": None}
        await e.advance(seconds=1)
        assert await e.state("reminder", "ann") == {"requested_at": iso(START), "fired_at": iso(START + dt.timedelta(days=7))}
        assert e.now() == START + dt.timedelta(days=7)
        took = time.monotonic() - started
        assert took < 5, f"a week took {took:.2f}s of real time"


async def test_a_daily_cron_fires_once_a_day_at_its_time_across_a_month(postgres: bool) -> None:
    async with env(app, start=START, postgres=postgres) as e:
        await e.y.stream("/").append({"type": "ticker.start", "payload": {"name": "t"}})
        await e.advance(days=31)  # January: the 1st 06:00 up to the 31st 06:00
        ticks = (await e.state("ticker", "t"))["ticks"]
        assert ticks == [iso(START + dt.timedelta(days=d, hours=6)) for d in range(31)]
        [schedule] = await e.y.instances().schedules((await e.instance("ticker", "t")).instance_id)
        assert schedule.due_at == int((START + dt.timedelta(days=31, hours=6)).timestamp() * 1000)


async def test_after_downtime_a_cron_that_missed_firings_fires_once_as_on_a_restart() -> None:
    async with env(app, start=START) as e:
        await e.y.stream("/").append({"type": "ticker.start", "payload": {"name": "t"}})
        await e.advance(days=2)  # January 1st and 2nd, 06:00
        await e.down_for(days=5)  # down from the 3rd, 00:00 to the 8th, 00:00: five firings missed
        await e.advance(days=1)  # the 8th, 06:00
        ticks = (await e.state("ticker", "t"))["ticks"]
        assert ticks == [iso(START + dt.timedelta(hours=6)), iso(START + dt.timedelta(days=1, hours=6)),
                         iso(START + dt.timedelta(days=7)), iso(START + dt.timedelta(days=7, hours=6))]


async def test_an_actor_backs_off_to_its_dead_letter_without_sleeping() -> None:
    async with env(app, start=START) as e:
        started = time.monotonic()
        await e.y.stream("/").append({"type": "job", "payload": {"id": "j1"}})
        async with e.auto_advance():
            [dead] = await e.until(lambda: e.dead_letters("flaky", "j1"))
        assert dead.attempts == 5 and "payment provider is down" in (dead.last_error or "")
        attempts = [dt.datetime.fromisoformat(a) for a in (await e.state("flaky", "j1"))["attempts"]]
        gaps = [(b - a).total_seconds() for a, b in zip(attempts, attempts[1:], strict=False)]
        # 60 s, 120 s, 240 s, 480 s, each +-20% (the backoff's jitter).
        assert len(gaps) == 4 and all(0.8 * 60 * 2**i <= gap <= 1.2 * 60 * 2**i for i, gap in enumerate(gaps)), gaps
        failures = await e.failures()
        assert [f.kind for f in failures] == ["dead_letter"]
        assert time.monotonic() - started < 5


async def test_auto_advance_walks_a_webhooks_whole_retry_ladder_until_it_halts(postgres: bool) -> None:
    async with WebhookReceiver() as receiver, env(app, start=START, postgres=postgres) as e:
        receiver.fail_all(500)
        outbox = e.y.stream("/outbox")
        await outbox.subscribe("hook", from_dict({"kind": "webhook", "url": receiver.url}), start="beginning")
        await outbox.append({"type": "invoice.issued", "payload": {"n": 1}})
        started = time.monotonic()
        async with e.auto_advance():
            status = await e.until(lambda: halted(e))
        took = time.monotonic() - started
        assert status.attempts == 15 and len(receiver.posts) == 15
        assert took < 5, f"the ladder took {took:.2f}s of real time"
        # The ladder's 1 s ... 30 min (each +-20%): about two and a half hours passed.
        assert dt.timedelta(hours=1.5) < e.now() - START < dt.timedelta(hours=4)
        [failure] = await e.failures()
        assert failure.kind == "halted" and failure.subscription == "hook"


async def halted(e):  # noqa: ANN001, ANN201
    status = await e.subscription("/outbox", "hook")
    return status if status.state == "halted" else None


async def test_retention_by_age_and_a_protocol_streams_ttl_expire_when_the_clock_passes_them() -> None:
    async with env(app, start=START) as e:
        logs = e.y.stream("/logs")
        await logs.create(max_age_s=3600)
        for n in range(3):
            await logs.append({"type": "line", "payload": {"n": n}})
        # A Durable Streams stream with a TTL of a day, through the HTTP API.
        created = await e.http.put("/v1/stream/chat", headers={"content-type": "application/json", "stream-ttl": "86400"})
        assert created.status_code == 201, created.text
        await e.advance(minutes=59)
        assert [ev.payload["n"] for ev in await e.events("/logs", type="line")] == [0, 1, 2]
        assert (await e.http.get("/v1/stream/chat", params={"offset": "-1"})).status_code == 200  # a read: the TTL restarts
        await e.advance(minutes=2)
        with pytest.raises(errors.CursorGone):
            await logs.read(after=0)
        await e.advance(hours=23, minutes=57)  # 24 h 58 min: a minute before it expires
        assert (await e.http.head("/v1/stream/chat")).status_code == 200  # (a HEAD does not restart it)
        await e.advance(minutes=2)
        assert (await e.http.get("/v1/stream/chat", params={"offset": "-1"})).status_code == 404


async def test_ctx_now_in_python_and_node_host_processes_is_the_runtimes_clock() -> None:
    async with env(app, start=START) as e:
        await e.advance(days=3)
        await e.y.stream("/").append({"type": "what.time", "payload": {"who": "py"}})
        await e.y.stream("/").append({"type": "what.time.node", "payload": {"who": "js"}})
        await e.idle()
        three_days = START + dt.timedelta(days=3)
        assert await e.state("clock_in_host", "py") == {"now": iso(three_days)}
        assert await e.state("clock_in_node", "js") == {"now": three_days.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


async def history(auto: bool) -> list[tuple[str, object, int]]:
    async with env(app, start=START) as e:
        root = e.y.stream("/")
        # Each input handled before the next: the instances' creation facts
        # on "/" come in one order.
        for event in ({"type": "reminder.requested", "payload": {"who": "ann"}},
                      {"type": "ticker.start", "payload": {"name": "t"}},
                      {"type": "job", "payload": {"id": "j1"}}):  # retried with jitter, then dead
            await root.append(event)
            await e.idle()
        if auto:
            async with e.auto_advance():
                await e.until(lambda: reached(e, START + dt.timedelta(days=8)))
        else:
            await e.advance(days=8)
        ticks = (await e.state("ticker", "t"))["ticks"][:8]
        reminder = await e.state("reminder", "ann")
        tries = await e.state("flaky", "j1")
        events = [(ev.type, ids_aside(ev.payload), ev.at) for ev in await e.events("/")]
        return [*events, ("ticks", ticks, 0), ("reminder", reminder, 0), ("tries", tries, 0)]


def ids_aside(payload: dict) -> dict:
    return {k: v for k, v in payload.items() if not k.endswith("_id")}


async def reached(e, moment: dt.datetime) -> bool:  # noqa: ANN001
    return e.now() >= moment


async def test_runs_are_deterministic_and_auto_advance_agrees_with_explicit_advances() -> None:
    explicit = await history(auto=False)
    assert explicit == await history(auto=False)
    assert explicit == await history(auto=True)


def test_a_due_time_set_on_the_clock_reads_back_as_its_milliseconds() -> None:
    """Float seconds of a ms due time must not read back 1 ms early (advance
    would loop on a due that stays just ahead)."""
    from yoke.clock import VirtualClock, wall_ms

    for due_ms in (2_147_483_648_002, 1_893_456_000_001, 1_099_511_627_777, 5):
        clock = VirtualClock(0)
        clock.set(due_ms / 1000)
        assert wall_ms(clock) == due_ms
