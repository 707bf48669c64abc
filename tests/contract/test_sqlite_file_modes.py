"""What Yoke writes on SQLite is its owner's alone, whatever the umask: the
database file and its -wal and -shm, the data directory, per-instance
databases and object files are created 0600 (directories 0700); files that
exist keep the mode an operator gave them."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import yoke
from yoke import App, Filter


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask (022): files would be world-readable by default."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_new_files_are_the_owners_alone(tmp_path: Path, open_umask: None) -> None:
    app = App()

    @app.actor("counter", filter=Filter(types=["inc"]))
    async def counter(ctx, event):
        await ctx.state.update(lambda s: {**s, "n": s.get("n", 0) + 1})

    data = tmp_path / "data"
    database = data / "yoke.db"
    async with yoke.open(f"sqlite:///{database}", app=app, data_dir=str(data / "state"), storage="file") as y:
        await y.instances("t").create("counter", key="k")
        await y.stream("/", "t").append({"type": "inc"})
        await y.wait_idle(timeout_s=20)
        body = b"bytes" * 100
        s = y.stream("/files", "t")
        o = await s.objects.prepare(idempotency_key="k", sha256=hashlib.sha256(body).hexdigest(), size=len(body))
        await s.objects.upload(o.object_id, body)
        files = [p for p in data.rglob("*") if p.is_file()]
        kinds = {p.name.rsplit(".", 1)[-1] if "." in p.name else p.name for p in files}
        # The main file with its -wal and -shm, an instance database with
        # its own, and the uploaded object.
        assert {"db", "db-wal", "db-shm"} <= kinds, kinds
        assert any("state" in p.parts for p in files) and any(o.object_id in str(p) for p in files), files
        assert {p.name: oct(mode(p)) for p in files if mode(p) != 0o600} == {}
        dirs = [data, *(p for p in data.rglob("*") if p.is_dir())]
        assert {str(p): oct(mode(p)) for p in dirs if mode(p) != 0o700} == {}


async def test_an_existing_file_keeps_its_mode(tmp_path: Path, open_umask: None) -> None:
    database = tmp_path / "shared.db"
    async with yoke.open(f"sqlite:///{database}") as y:
        await y.stream("/a").append({"type": "x"})
    os.chmod(database, 0o640)  # an operator's choice (a group that backs it up)
    async with yoke.open(f"sqlite:///{database}") as y:
        await y.stream("/a").append({"type": "x"})
    assert mode(database) == 0o640
