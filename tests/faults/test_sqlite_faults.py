"""SQLite: a database file that cannot be used right now is ``unavailable``."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import pytest

import yoke
from yoke import errors

from .common import is_driver_error, wait_until

TENANT = "faults"


async def test_a_write_lock_held_beyond_the_busy_timeout_is_unavailable(tmp_path, caplog) -> None:
    """Another process holds the write lock longer than the busy timeout:
    an append without a key fails with ``unavailable`` (database_locked),
    reads go on (WAL), and an append with a key commits once the lock is
    released while it is still retrying."""
    caplog.set_level(logging.INFO, logger="yoke.streams.append")
    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        stream = y.stream("/locked", tenant=TENANT)
        await stream.append({"type": "before"})
        store = y.store
        # The default busy timeout is 10 s; a test needs it short.
        await store.db.write(lambda: store.db.writer.execute("PRAGMA busy_timeout=100"))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another writer, holding the lock
            with pytest.raises(errors.Unavailable) as caught:
                await stream.append({"type": "during"})
            assert caught.value.details == {"reason": "database_locked", "retry_after": 1}
            assert caught.value.http_status == 503 and not is_driver_error(caught.value)
            assert [e.type for e in await stream.read()] == ["before"]

            keyed = asyncio.create_task(stream.append({"type": "keyed", "idempotency_key": "k"}))
            await wait_until(lambda: "committing the keyed calls again" in caplog.text, 10, "a retry")
            other.execute("ROLLBACK")
            result = await keyed
        finally:
            other.close()
        assert result.offset == 2
        assert [(e.offset, e.type) for e in await stream.read()] == [(1, "before"), (2, "keyed")]


async def test_a_sql_error_is_not_translated(tmp_path) -> None:
    """Only faults of the file become ``unavailable``: a broken statement
    stays the bug it is."""
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store.db.read(lambda: store.db.reader().execute("SELECT * FROM no_such_table").fetchall())


async def test_commits_that_wait_together_fail_alone(tmp_path) -> None:
    """The writer thread takes every commit waiting into one transaction
    (one fsync for appends to many streams); when one fails halfway (here a
    trigger refusing its second event, after its stream was created and its
    first event inserted), the group runs again with a savepoint each, so it
    leaves nothing behind and the others commit once."""
    import threading

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        await store.db.write(lambda: store.db.writer.execute(
            "CREATE TRIGGER refuse_boom BEFORE INSERT ON event_rows WHEN NEW.type = 'boom'"
            " BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
        ))
        gate = threading.Event()
        holding = asyncio.ensure_future(store.db.write(gate.wait))  # the writer thread, busy
        try:
            fine = [asyncio.ensure_future(y.stream(f"/ok{i}", tenant=TENANT).append({"type": "e"})) for i in range(5)]
            bad = asyncio.ensure_future(
                y.stream("/bad", tenant=TENANT).append_many([{"type": "e"}, {"type": "boom"}])
            )
            await wait_until(lambda: len(store.db._commits) == 6, 10, "six commits waiting")
        finally:
            gate.set()
        await holding
        assert [r.offset for r in await asyncio.gather(*fine)] == [1] * 5
        with pytest.raises(sqlite3.IntegrityError, match="boom refused"):
            await bad
        with pytest.raises(errors.StreamNotFound):
            await y.stream("/bad", tenant=TENANT).info()
        created = [e.payload["path"] for e in await y.stream("/", tenant=TENANT).read()]
        assert sorted(created) == [f"/ok{i}" for i in range(5)]
        assert [e.type for e in await y.stream("/ok3", tenant=TENANT).read()] == ["e"]


async def test_a_full_disk_fails_every_commit_waiting_together_as_unavailable(tmp_path) -> None:
    """SQLite rolls the whole transaction back when the disk is full: every
    commit of the group learns ``unavailable`` (disk_full, a 503 over
    HTTP), none is half written, and appends go on once there is room."""
    import threading

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        for i in range(3):
            await y.stream(f"/full{i}", tenant=TENANT).append({"type": "before"})
        pages = await store.db.write(lambda: store.db.writer.execute("PRAGMA page_count").fetchone()[0])
        await store.db.write(lambda: store.db.writer.execute(f"PRAGMA max_page_count={pages}"))
        gate = threading.Event()
        holding = asyncio.ensure_future(store.db.write(gate.wait))
        big = {"type": "big", "payload": "x" * 50_000}
        try:
            appends = [asyncio.ensure_future(y.stream(f"/full{i}", tenant=TENANT).append(big)) for i in range(3)]
            await wait_until(lambda: len(store.db._commits) == 3, 10, "three commits waiting")
        finally:
            gate.set()  # never leave the writer thread waiting (closing would wait behind it)
        await holding
        for append in appends:
            with pytest.raises(errors.Unavailable) as caught:
                await append
            assert caught.value.details["reason"] == "disk_full"
        await store.db.write(lambda: store.db.writer.execute("PRAGMA max_page_count=1073741823"))
        for i in range(3):
            s = y.stream(f"/full{i}", tenant=TENANT)
            assert [e.type for e in await s.read()] == ["before"]  # nothing half written
            assert (await s.append(big)).offset == 2


async def test_a_commit_cancelled_before_the_writer_takes_it_writes_nothing(tmp_path) -> None:
    import threading

    from yoke.events import prepare
    from tests.conftest import now_ms

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        gate = threading.Event()
        holding = asyncio.ensure_future(store.db.write(gate.wait))
        try:
            cancelled = asyncio.ensure_future(
                store.commit(TENANT, "/gone", [prepare({"type": "e"})], [0], now_ms(), "s1")
            )
            kept = asyncio.ensure_future(store.commit(TENANT, "/kept", [prepare({"type": "e"})], [0], now_ms(), "s2"))
            await wait_until(lambda: len(store.db._commits) == 2, 10, "two commits waiting")
            cancelled.cancel()
        finally:
            gate.set()
        await holding
        assert (await kept).outcomes[0].offset == 1
        assert cancelled.cancelled()
        assert await store.info(TENANT, "/gone") is None
