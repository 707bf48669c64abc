"""Where the instances' state lives (actors/state_home.py), on both backends:
the first executor records its home; an executor elsewhere (another data
directory, another storage mode) refuses to start, naming both places; a
process that only reads state answers state_elsewhere instead of an empty
database; a process that never opens state is never asked."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import yoke
from yoke import App, Filter, errors
from yoke.actors.state_home import ID_FILE, directory_id

T = "acme"


def counter_app() -> App:
    app = App()

    @app.actor("counter", filter=Filter(types=["tick"]), singleton=True)
    async def counter(ctx, event):
        await ctx.state.update(lambda s: {"n": (s or {}).get("n", 0) + 1})

    return app


async def test_state_is_never_read_or_run_from_another_home(fresh_url: str, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    app = counter_app()
    async with yoke.open(fresh_url, app=app, data_dir=str(one), storage="file") as y:
        await y.stream("/", T).append_many([{"type": "tick"}] * 3)
        await y.wait_idle(timeout_s=20)
        (inst,) = await y.instances(T).list()
    assert (one / "actors" / ID_FILE).exists()

    # An executor with another data directory: refused, both places named.
    with pytest.raises(errors.StateElsewhere) as refused:
        async with yoke.open(fresh_url, app=app, data_dir=str(two), storage="file"):
            pass
    message = refused.value.message
    assert str(one / "actors") in message and str(two / "actors") in message
    assert "YOKE_DATA_DIR" in message and "YOKE_STORAGE=pg_sqlite" in message
    # ... and one keeping its state in another storage mode.
    with pytest.raises(errors.StateElsewhere, match="pg_sqlite storage"):
        async with yoke.open(fresh_url, app=app, data_dir=str(one), storage="pg_sqlite"):
            pass

    # A process elsewhere without an executor works, until it would read state.
    three = tmp_path / "three"
    async with yoke.open(fresh_url, data_dir=str(three), storage="file") as y:
        created = await y.tokens.create(T, ["read"], name="from elsewhere")
        assert created.token
        with pytest.raises(errors.StateElsewhere) as answered:
            await y.instances(T).state(inst.instance_id)
        assert answered.value.code == "state_elsewhere" and str(one / "actors") in answered.value.message
        with pytest.raises(errors.StateElsewhere):
            await y.instances(T).query(inst.instance_id, "SELECT 1")
        assert not (three / "actors" / ID_FILE).exists()  # a reader makes no id

    # The recorded home reads (and runs) as before.
    async with yoke.open(fresh_url, data_dir=str(one), storage="file") as y:
        assert await y.instances(T).state(inst.instance_id) == ({"n": 3}, 3)
    async with yoke.open(fresh_url, app=app, data_dir=str(one), storage="file") as y:
        await y.stream("/", T).append({"type": "tick"})
        await y.wait_idle(timeout_s=20)
        assert await y.instances(T).state(inst.instance_id) == ({"n": 4}, 4)


def test_one_directory_gets_one_id_however_many_processes_race(tmp_path: Path) -> None:
    root = tmp_path / "actors"
    ids: list[str | None] = []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        ids.append(directory_id(root, create=True))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and ids[0]
    assert sorted(p.name for p in root.iterdir()) == [ID_FILE]  # no draft left behind
    assert directory_id(root, create=False) == ids[0]
    assert directory_id(tmp_path / "elsewhere", create=False) is None
