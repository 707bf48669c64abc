"""Instance database files (FileStorage): a new one is made whole from a
template, synced, in WAL mode, private; an old one gets the kernel's
tables it lacks; how many stay open follows the setting and the
process's descriptor limit, which `yoke serve` and `yoke worker` raise."""

from __future__ import annotations

import logging
import os
import resource
import sqlite3
import stat
import subprocess
import sys

import pytest

import yoke
from yoke.actors.state import FileStorage, StateDatabases, max_open_databases
from yoke.actors.state_capture import SEQ_TABLE


async def test_a_new_instance_database_is_a_private_wal_file_with_the_kernel_tables(tmp_path) -> None:
    databases = StateDatabases(FileStorage(tmp_path / "actors"))
    try:
        db = databases.get("t", "inst_new")
        assert await db.state_cas(0, {"n": 1}) == (True, 1)
    finally:
        await databases.close()
    path = FileStorage(tmp_path / "actors").path("t", "inst_new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no file half made
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT value, version FROM _yoke_state").fetchall() == [('{"n":1}', 1)]
        assert conn.execute(f"SELECT id FROM {SEQ_TABLE}").fetchall() == [(1,)]
    finally:
        conn.close()


async def test_a_database_of_an_older_build_opens_in_wal_mode_and_keeps_its_rows(tmp_path) -> None:
    storage = FileStorage(tmp_path / "actors")
    path = storage.path("t", "inst_old")
    path.parent.mkdir(parents=True)
    old = sqlite3.connect(path)  # as a build before the change counter made it: rollback journal, state only
    old.execute("CREATE TABLE _yoke_state (id INTEGER PRIMARY KEY CHECK (id = 1), value TEXT NOT NULL,"
                " version INTEGER NOT NULL)")
    old.execute("""INSERT INTO _yoke_state VALUES (1, '{"kept": true}', 7)""")
    old.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")
    old.execute("INSERT INTO orders VALUES (1, 'open')")
    old.commit()
    old.close()
    databases = StateDatabases(storage)
    try:
        db = databases.get("t", "inst_old")
        assert await db.state_get() == ({"kept": True}, 7)
        assert await db.query("SELECT status FROM orders", []) == [{"status": "open"}]
    finally:
        await databases.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


async def test_a_file_left_half_made_by_a_crash_is_not_what_opens(tmp_path) -> None:
    """A crash between the template's write and its link leaves a file under
    a name of its own; the instance's database is made whole beside it."""
    storage = FileStorage(tmp_path / "actors")
    path = storage.path("t", "inst_crash")
    path.parent.mkdir(parents=True)
    (path.parent / f".{path.name}.0badf00d.new").write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    databases = StateDatabases(storage)
    try:
        db = databases.get("t", "inst_crash")
        assert await db.state_cas(0, {"ok": True}) == (True, 1)
        assert await db.state_get() == ({"ok": True}, 1)
    finally:
        await databases.close()


def test_the_bound_of_open_databases_follows_the_setting_within_the_descriptor_limit(caplog) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    fit = max(16, (soft - 256) // 4)
    assert max_open_databases(0) == min(1_000, fit)
    assert max_open_databases(20) == 20
    with caplog.at_level(logging.WARNING, logger="yoke.actors.state"):
        assert max_open_databases(fit + 1) == fit
    assert "actor_open_databases" in caplog.text and "ulimit -n" in caplog.text


async def test_the_runtime_takes_actor_open_databases(tmp_path) -> None:
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", data_dir=str(tmp_path), actor_open_databases=24) as y:
        assert y.state_databases().max_connections == 24


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_yoke_serve_and_worker_raise_their_descriptor_limit_to_the_hard_one(command, tmp_path) -> None:
    """Run as a process would: a soft limit of 512 under a higher hard one
    (the usual 1,024 under 524,288), and the command's own code raises it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip("the hard descriptor limit is too low to lower the soft one under it")
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from yoke import descriptors\n"
        "from yoke.cli import server\n"
        "calls = []\n"
        "real = descriptors.raise_soft_limit\n"
        "def watched():\n"
        "    calls.append(real())\n"
        "    raise SystemExit(0)\n"  # the limit is raised before anything starts: stop there
        "descriptors.raise_soft_limit = watched\n"
        "import atexit\n"
        "atexit.register(lambda: print('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0], calls))\n"
        "from yoke.cli import main\n"
        f"sys.argv = ['yoke', {command!r}, '--db', 'sqlite:///{tmp_path}/y.db'"
        + (", '--app', 'nowhere:app'" if command == "worker" else "") + "]\n"
        "main(prog_name='yoke')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "YOKE_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    expected = hard if hard != resource.RLIM_INFINITY else 512
    assert f"soft {expected} [{expected}]" in result.stdout, result.stdout + result.stderr[-2000:]
