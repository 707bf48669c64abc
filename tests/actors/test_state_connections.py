"""Instance databases hold a bounded number of connections.

A worker with thousands of keyed instances kept every instance's SQLite
connection open (three file descriptors each on the embedded default), ran
out of descriptors, and dead-lettered the events of every instance it could
no longer open. Past ``max_connections`` the least recently used idle
databases now close theirs and open again on their next operation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

from yoke.actors.state import FileStorage, StateDatabases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_connections_past_the_bound_close_and_their_data_stays(tmp_path) -> None:
    databases = StateDatabases(FileStorage(tmp_path / "actors"), max_connections=20)
    try:
        before = open_files()
        for round_ in range(3):
            for i in range(100):
                db = databases.get("t", f"inst_{i}")
                written, version = await db.state_cas(round_, {"n": round_ + 1, "i": i})
                assert written and version == round_ + 1
            # The trim runs after the operation that went past the bound.
            await asyncio.sleep(0)
            if databases._trimming is not None:
                await databases._trimming
            # Three descriptors a connection, at most the bound of them (and
            # the trim leaves a tenth free).
            assert open_files() - before <= 3 * 20, open_files() - before
        for i in range(100):  # every write is there, through reopened connections
            value, version = await databases.get("t", f"inst_{i}").state_get()
            assert (value, version) == ({"n": 3, "i": i}, 3)
    finally:
        await databases.close()


async def test_a_database_in_an_atomic_run_keeps_its_connection(tmp_path) -> None:
    databases = StateDatabases(FileStorage(tmp_path / "actors"), max_connections=16)
    try:
        held = databases.get("t", "inst_held")
        await held.state_set({"before": "the run"})
        await held.begin_run()
        await held.state_set({"inside": "the run"})
        assert not await held.release_connection()  # its transaction is open
        for i in range(40):  # push it out of the recent ones
            await databases.get("t", f"inst_{i}").state_set({"i": i})
        if databases._trimming is not None:
            await databases._trimming
        assert databases.connections <= 16
        # Still the run's transaction: its write is seen inside, and gone
        # once rolled back (a closed connection would have lost it early).
        assert await held.state_get() == ({"inside": "the run"}, 2)
        await held.rollback_run()
        held.end_run()
        assert await held.release_connection()
        assert await held.state_get() == ({"before": "the run"}, 1)
    finally:
        await databases.close()


async def test_an_operation_waiting_for_a_connection_gets_one_when_a_run_ends(tmp_path) -> None:
    """Every connection held by an atomic run: another database's operation
    waits, and goes on once the run ends (the run's end, not only an
    operation's, tells the waiters)."""
    databases = StateDatabases(FileStorage(tmp_path / "actors"), max_connections=1)
    try:
        running = databases.get("t", "inst_running")
        await running.begin_run()
        await running.state_set({"n": 1})
        waiting = asyncio.create_task(databases.get("t", "inst_waiting").state_set({"n": 2}))
        while databases._op_ended is None:  # until it waits for a connection to come free
            await asyncio.sleep(0)
        assert not waiting.done() and databases.connections == 1
        first = databases._op_ended
        await running.rollback_run()  # an operation: it ends while the run still holds the database
        while databases._op_ended is first or databases._op_ended.done():  # back to waiting
            await asyncio.sleep(0)
        assert not waiting.done()
        running.end_run()
        async with asyncio.timeout(5):
            assert await waiting == 1
        assert databases.connections <= 1
    finally:
        await databases.close()


SCRIPT = textwrap.dedent(
    """
    import asyncio, resource, sys
    import yoke
    from yoke import App, Filter

    # A descriptor budget far below what 400 open instance files take.
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    app = App()
    done = []

    @app.actor("counter", filter=Filter(types=["count"], key="payload.k"), max_attempts=1)
    async def counter(ctx, event):
        await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1})
        done.append(event.payload["k"])

    async def main():
        async with yoke.open(f"sqlite:///{sys.argv[1]}/yoke.db", app=app, data_dir=sys.argv[1]) as y:
            await y.stream("/").append_many([{"type": "count", "payload": {"k": str(i % 400)}} for i in range(800)])
            async with asyncio.timeout(120):
                while len(done) < 800:
                    dead = await y.store.actors.dead_by_instance("default", 10)
                    if dead:
                        raise SystemExit(f"dead letters: {dead}")
                    await asyncio.sleep(0.1)
            print("processed", len(done))

    asyncio.run(main())
    """
)


def test_a_worker_with_more_instances_than_descriptors_processes_them_all(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "processed 800" in result.stdout
