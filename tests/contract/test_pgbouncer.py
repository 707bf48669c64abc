"""Yoke behind a real PgBouncer (Debian's ``pgbouncer``, installed by
``make test``). In session mode every client connection keeps one server
connection, so everything works, LISTEN included: appends, live tails,
actors and their wake-ups. In transaction mode LISTEN cannot work (a
notification reaches whichever client holds the server connection then,
or none), so Yoke refuses to start with ``notifications_lost``, before any
migration or prepared statement."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import yoke
from tests.conftest import PG_ADMIN_URL
from tests.http.conftest import free_port
from yoke import App, Filter, errors

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@contextmanager
def pgbouncer(mode: str) -> Iterator[int]:
    """A PgBouncer in ``mode`` in front of the test server: its port."""
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed (make test installs Debian's)")
    server = urlsplit(PG_ADMIN_URL)
    # It runs as postgres when the tests run as root (it refuses root): a
    # directory that user can reach (pytest's tmp_path is root's alone).
    where = Path(tempfile.mkdtemp(prefix=f"yoke-pgbouncer-{mode}-"))
    where.chmod(0o777)
    port = free_port()
    (where / "users.txt").write_text('"postgres" ""\n"yoke_runtime" ""\n')
    (where / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.hostname} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {where / 'users.txt'}\npool_mode = {mode}\n"
        f"logfile = {where / 'pgbouncer.log'}\npidfile = {where / 'pgbouncer.pid'}\n"
        "max_client_conn = 500\ndefault_pool_size = 40\n"
    )
    command = [PGBOUNCER, str(where / "pgbouncer.ini")]
    if os.getuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, f"pgbouncer exited: {process.stderr.read()}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "pgbouncer did not listen within 20 s"
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(20)
        shutil.rmtree(where, ignore_errors=True)


def through(port: int, database_url: str) -> str:
    """``database_url`` with PgBouncer's address in place of the server's."""
    parts = urlsplit(database_url)
    return parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()


@pytest.mark.parametrize("fresh_url", ["postgres"], indirect=True)
async def test_session_mode_carries_everything(fresh_url: str, tmp_path: Path) -> None:
    """A database of its own: the executor would run every tenant's queues."""
    app = App()
    seen: list[int] = []

    @app.actor("counter", filter=Filter(types=["tick"], key="payload.k"))
    async def counter(ctx, event):
        await ctx.state.update(lambda n: (n or 0) + 1)
        seen.append(event.payload["n"])

    with pgbouncer("session") as port:
        url = through(port, fresh_url)
        # Sweeps a minute apart: only NOTIFY can wake the tail and the actors in time.
        slow = {"tail_sweep_s": 60, "scheduler_sweep_s": 60, "subscription_sweep_s": 60}
        async with yoke.open(url, app=app, data_dir=str(tmp_path), **slow) as y, \
                yoke.open(url, executor=False, data_dir=str(tmp_path / "b")) as other:
            stream = y.stream("/bounced", "t_pgbouncer")
            elsewhere = other.stream("/bounced", "t_pgbouncer")
            await elsewhere.append({"type": "tick", "payload": {"k": "a", "n": 0}})
            tail = stream.tail(after=0)
            async with asyncio.timeout(10):
                assert (await tail.__anext__()).payload == {"k": "a", "n": 0}  # read back
            # Now waiting live; appended by another process's connections:
            # the tail hears of it through NOTIFY, carried by the pooler.
            await elsewhere.append_many([{"type": "tick", "payload": {"k": "a", "n": n}} for n in range(1, 5)])
            async with asyncio.timeout(10):
                assert (await tail.__anext__()).payload == {"k": "a", "n": 1}
            await y.wait_idle(timeout_s=10)
            assert sorted(seen) == list(range(5))
            (instance,) = await y.instances("t_pgbouncer").list()
            value, _ = await y.instances("t_pgbouncer").state(instance.instance_id)
            assert value == 5
            await tail.aclose()


async def test_transaction_mode_is_refused_with_the_reason(pg_url: str, tmp_path: Path) -> None:
    with pgbouncer("transaction") as port:
        started = time.monotonic()
        with pytest.raises(errors.NotificationsLost) as refused:
            async with yoke.open(through(port, pg_url), data_dir=str(tmp_path)):
                pass
        assert time.monotonic() - started < 15
        said = refused.value.message
        assert "pool_mode=transaction" in said and "session mode" in said
        assert refused.value.code == "notifications_lost"
