"""PostgreSQL connection cuts under Python load.

Eight producers append to one stream while every session of the runtime
role is terminated five times (``pg_terminate_backend``, paced by the
appends done). Callers may only ever see ``errors.Unavailable``; keyed
appends retried with their key land exactly once; a tail in the same
process and one in another runtime (woken only through LISTEN) see every
event once, in order. A proxy then holds cut connections in the state that
made asyncpg raise ``InternalClientError``, deterministically.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import pytest

import yoke
from yoke import errors

from .common import Canceller, Cutter, Progress, assert_exact, is_driver_error, pg_database, wait_until
from .proxy import PgProxy

TENANT = "faults"
PRODUCERS = 8
UNKEYED = 2  # of the producers: their outcome after a cut is unknown, and must be reported so
CUTS = 5
APPENDS_PER_CUT = 300


async def collect(stream: yoke.Stream, into: list, progress: Progress) -> None:
    async for event in stream.tail(after=0):
        into.append(event)
        await progress.add()


async def test_cuts_under_python_load() -> None:
    async with pg_database() as url, Cutter(url) as cutter:
        # ``other`` stands for another process: its tails wake only through
        # its LISTEN connection (the sweep is a minute away).
        async with yoke.open(url, executor=False) as y, yoke.open(url, executor=False, tail_sweep_s=60) as other:
            stream = y.stream("/load", tenant=TENANT)
            await stream.create()
            done = Progress()
            stop = asyncio.Event()
            keys: list[str] = []
            unkeyed_ok: dict[str, int] = {}  # payload id -> offset returned
            unkeyed_unknown: set[str] = set()  # payload ids whose append answered unavailable
            unexpected: list[BaseException] = []
            retries = {"append": 0, "read": 0}

            async def producer(p: int) -> None:
                keyed = p >= UNKEYED
                n = 0
                while not stop.is_set():
                    n += 1
                    key = f"p{p}-{n}"
                    event = {"type": "load", "payload": {"id": key}}
                    if keyed:
                        event["idempotency_key"] = key
                    while True:
                        try:
                            result = await stream.append(event)
                            break
                        except errors.Unavailable as exc:
                            assert exc.http_status == 503 and exc.details["retry_after"] >= 1
                            retries["append"] += 1
                            if keyed:
                                continue  # the same key again: at most once
                            unkeyed_unknown.add(key)
                            result = None
                            break
                        except BaseException as exc:  # noqa: BLE001 - recorded, asserted below
                            unexpected.append(exc)
                            return
                    if keyed:
                        keys.append(key)
                    elif result is not None:
                        unkeyed_ok[key] = result.offset
                    await done.add()

            async def reader() -> None:
                while not stop.is_set():
                    try:
                        await stream.read(after=0, limit=100)
                    except errors.Unavailable:
                        retries["read"] += 1
                    except BaseException as exc:  # noqa: BLE001
                        unexpected.append(exc)
                        return

            here: list[yoke.Event] = []
            there: list[yoke.Event] = []
            seen_here, seen_there = Progress(), Progress()
            tails = [
                asyncio.create_task(collect(stream, here, seen_here)),
                asyncio.create_task(collect(other.stream("/load", tenant=TENANT), there, seen_there)),
            ]
            workers = [asyncio.create_task(producer(p)) for p in range(PRODUCERS)]
            workers += [asyncio.create_task(reader()) for _ in range(2)]
            generation = other.store.listener.generation
            try:
                for i in range(1, CUTS + 1):
                    await done.reach(i * APPENDS_PER_CUT, timeout_s=20)
                    assert not unexpected, unexpected
                    await cutter.cut()
                await done.reach((CUTS + 1) * APPENDS_PER_CUT, timeout_s=20)
            finally:
                stop.set()
                await asyncio.gather(*workers)
            assert not unexpected, [repr(e) for e in unexpected]
            assert cutter.sessions_ended >= CUTS

            events = await read_all(stream)
            total = len(events)
            # Both tails see everything once, in order; the other runtime only
            # through its listener, which must have reconnected after the cuts.
            await seen_here.reach(total, timeout_s=15)
            await seen_there.reach(total, timeout_s=15)
            for task in tails:
                task.cancel()
            await asyncio.gather(*tails, return_exceptions=True)
            assert [e.offset for e in here] == [e.offset for e in there] == list(range(1, total + 1))
            assert other.store.listener.generation > generation

            assert_exact(events, keys, unkeyed=True)
            by_id = {e.payload["id"]: e.offset for e in events if e.idempotency_key is None}
            for key, offset in unkeyed_ok.items():
                assert by_id.get(key) == offset, key  # a returned append is there, at its offset
            # An append that answered unavailable was committed at most once.
            assert set(by_id) <= set(unkeyed_ok) | unkeyed_unknown
            print(f"cuts={cutter.cuts} sessions ended={cutter.sessions_ended} events={total}"
                  f" unavailable: appends={retries['append']} reads={retries['read']}")


async def read_all(stream: yoke.Stream) -> list[yoke.Event]:
    events: list[yoke.Event] = []
    while True:
        page = await stream.read(after=events[-1].offset if events else 0, limit=10_000)
        if not page:
            return events
        events += page


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))


async def test_connections_cut_while_idle_in_the_pool_are_replaced(caplog) -> None:
    """The root cause of ``InternalClientError('cannot switch to state 12;
    another operation (2) is in progress')``: the server's FATAL message
    read by an idle pooled connection whose end of stream is not read yet.
    Here every pooled connection is held in that state for 0.5 s while
    unkeyed appends (never retried on an unknown outcome) and reads run:
    each must succeed, on a fresh connection, since nothing was sent."""
    caplog.set_level(logging.INFO, logger="yoke.store.postgres")
    async with pg_database() as url:
        target = urlsplit(url)
        proxy = PgProxy(target.hostname or "127.0.0.1", target.port or 5432)
        await proxy.start()
        try:
            async with yoke.open(through(url, proxy.port), executor=False, pg_pool_min=4) as y:
                stream = y.stream("/idle", tenant=TENANT)
                await stream.create()
                # Open several pooled connections, then let them go idle.
                await asyncio.gather(*(stream.read() for _ in range(8)))
                for round_ in range(3):
                    ended = proxy.terminate_all(close_after_s=0.5)
                    assert ended >= 3  # pooled connections and the listener
                    results = await asyncio.gather(
                        *(stream.append({"type": "x", "payload": {"round": round_, "i": i}}) for i in range(10)),
                        *(stream.read() for _ in range(4)),
                        return_exceptions=True,
                    )
                    failures = [r for r in results if isinstance(r, BaseException)]
                    assert not failures, [repr(f) for f in failures]
                events = await stream.read(limit=1000)
                assert [e.offset for e in events] == list(range(1, 31))
                assert sorted((e.payload["round"], e.payload["i"]) for e in events) == [
                    (r, i) for r in range(3) for i in range(10)
                ]
        finally:
            await proxy.close()
    assert "a pooled connection had been cut" in caplog.text


async def test_a_database_refusing_connections_is_unavailable(monkeypatch) -> None:
    """Connections refused: appends fail at once with ``unavailable`` (503,
    Retry-After), keyed ones and reads after retrying for a while; all recover."""
    from tests.conftest import admin_sql
    from yoke.store import faults
    from yoke.streams import append

    monkeypatch.setattr(faults, "READ_RETRY_S", 1.0)  # 3 s each by default
    monkeypatch.setattr(append, "APPEND_RETRY_S", 1.0)

    async with pg_database() as url, Cutter(url) as cutter:
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/refused", tenant=TENANT)
            await stream.append({"type": "before"})
            await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS false')
            try:
                await cutter.cut()
                for call in (
                    stream.append({"type": "during"}),
                    stream.append({"type": "during", "idempotency_key": "k1"}),
                    stream.read(),
                    y.tokens.authenticate("yk_tok_0123456789abcdef." + "a" * 43),
                ):
                    with pytest.raises(errors.Unavailable) as caught:
                        await call
                    assert caught.value.code == "unavailable" and caught.value.http_status == 503
                    assert caught.value.details["retry_after"] >= 1
                    assert not is_driver_error(caught.value)
            finally:
                await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS true')
            await stream.append({"type": "after", "idempotency_key": "k2"})
            assert [e.type for e in await stream.read()] == ["before", "after"]


CANCEL_PRODUCERS = 4  # keyed batch producers (the reviewer's load), plus UNKEYED unkeyed ones
BATCH = 5
CANCEL_BATCHES = 600  # batches to commit while statements are being cancelled
ROLLED_BACK_REASONS = {"cancelled", "conflict"}


async def test_cancels_under_python_load(caplog) -> None:
    """``pg_cancel_backend`` on every active runtime session, every few
    milliseconds, under keyed and unkeyed batch appends, reads and a tail.
    A cancelled statement's transaction is rolled back and its connection
    lives on: no driver exception reaches a caller; the only error is
    ``Unavailable`` with reason ``cancelled`` (or ``conflict``), after the
    appender retried (keyed and unkeyed groups alike, since nothing was
    written); a keyed batch sent again lands once, and an unkeyed batch
    that answered ``cancelled`` is not in the stream at all."""
    caplog.set_level(logging.INFO, logger="yoke")
    async with pg_database() as url, Canceller(url) as canceller:
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/cancels", tenant=TENANT)
            await stream.create()
            done = Progress()
            stop = asyncio.Event()
            keys: list[str] = []
            unkeyed_ok: dict[str, int] = {}  # payload id -> offset returned
            unkeyed_refused: set[str] = set()  # answered cancelled/conflict: nothing written
            reasons: Counter = Counter()
            unexpected: list[BaseException] = []

            def record(exc: errors.Unavailable) -> None:
                reasons[exc.details.get("reason")] += 1
                assert exc.http_status == 503 and exc.details["retry_after"] >= 1
                assert exc.details["reason"] in ROLLED_BACK_REASONS, exc.details

            async def producer(p: int) -> None:
                keyed = p < CANCEL_PRODUCERS
                n = 0
                while not stop.is_set():
                    n += 1
                    ids = [f"p{p}-{n}-{i}" for i in range(BATCH)]
                    batch = [{"type": "load", "payload": {"id": i}} for i in ids]
                    if keyed:
                        for event, i in zip(batch, ids):
                            event["idempotency_key"] = i
                    while True:
                        try:
                            results = await stream.append_many(batch)
                            break
                        except errors.Unavailable as exc:
                            record(exc)
                            if keyed:
                                continue  # the same keys again: at most once
                            unkeyed_refused.update(ids)
                            results = None
                            break
                        except BaseException as exc:  # noqa: BLE001 - asserted below
                            unexpected.append(exc)
                            stop.set()
                            return
                    if keyed:
                        keys.extend(ids)
                    elif results is not None:
                        unkeyed_ok.update((i, r.offset) for i, r in zip(ids, results))
                    await done.add()

            async def reader() -> None:
                while not stop.is_set():
                    try:
                        await stream.read(after=0, limit=100)
                    except errors.Unavailable as exc:
                        record(exc)
                    except BaseException as exc:  # noqa: BLE001
                        unexpected.append(exc)
                        stop.set()
                        return

            tailed: list[yoke.Event] = []
            seen = Progress()
            tail = asyncio.create_task(collect(stream, tailed, seen))
            workers = [asyncio.create_task(producer(p)) for p in range(CANCEL_PRODUCERS + UNKEYED)]
            workers.append(asyncio.create_task(reader()))
            cancels = asyncio.create_task(canceller.run(stop, interval_s=0.003))
            try:
                async with asyncio.timeout(90):
                    while done.count < CANCEL_BATCHES and not stop.is_set():
                        await asyncio.sleep(0.05)
            finally:
                stop.set()
                await asyncio.gather(*workers, cancels)
            assert not unexpected, [repr(e) for e in unexpected]
            assert not any(is_driver_error(e) for e in unexpected)

            events = await read_all(stream)
            assert_exact(events, keys, unkeyed=True)
            by_id = {e.payload["id"]: e.offset for e in events if e.idempotency_key is None}
            for i, offset in unkeyed_ok.items():
                assert by_id.get(i) == offset, i
            # Cancelled means rolled back: an unkeyed batch that answered so is absent.
            assert not unkeyed_refused & set(by_id), sorted(unkeyed_refused & set(by_id))[:5]
            assert set(by_id) == set(unkeyed_ok)
            await seen.reach(len(events), timeout_s=15)
            tail.cancel()
            await asyncio.gather(tail, return_exceptions=True)
            assert [e.offset for e in tailed] == list(range(1, len(events) + 1))
            # The cancels did land (statements failed and were tried again).
            retried = [r for r in caplog.records if "cancel" in r.getMessage()]
            # How many land depends on how long statements run (a cancel that
            # finds its backend idle does nothing): 17 of 70 in one run.
            assert len(retried) >= 10, (canceller.signalled, len(retried))
            assert "the database connection was lost" not in caplog.text
            print(f"cancel signals={canceller.signalled} retries logged={len(retried)}"
                  f" batches={done.count} events={len(events)} unavailable={dict(reasons)}")


async def test_an_unkeyed_append_waits_out_refused_connections(caplog) -> None:
    """Refused connections wrote nothing (``connect_failed``), so the
    appender tries an append without a key again, like a keyed one: when
    connections come back within the retry budget it lands, once."""
    from tests.conftest import admin_sql

    caplog.set_level(logging.INFO, logger="yoke.streams.append")
    async with pg_database() as url, Cutter(url) as cutter:
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/refused", tenant=TENANT)
            await stream.append({"type": "before"})
            await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS false')
            try:
                await cutter.cut()
                pool = y.store.db.pool
                await wait_until(  # the pool has seen its connections end
                    lambda: all(h._con is None or h._con.is_closed() for h in pool._holders), 10, "closed pool"
                )
                pending = asyncio.create_task(stream.append({"type": "during"}))
                await wait_until(lambda: "committing the calls again" in caplog.text, 10, "a refused attempt")
                assert not pending.done()
            finally:
                await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS true')
            assert (await pending).offset == 2
            assert [e.type for e in await stream.read()] == ["before", "during"]
