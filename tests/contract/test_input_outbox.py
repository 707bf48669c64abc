"""Input records and their delivery outbox (the input outbox of workflow
streams): records and outbox rows commit together; the
dispatcher publishes one deterministic wake event per record on the wake
stream, whatever crashes in between. Both backends; the crash is a real
one (a writer process killed with SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import yoke
from yoke import App, Filter
from yoke.streams.inputs import WAKE_TYPE, wake_id, wake_key

ROOT = Path(__file__).resolve().parents[2]


async def wakes(y: yoke.Runtime, tenant: str, path: str) -> list[yoke.Event]:
    try:
        return [e for e in await y.stream(path, tenant).read(limit=10_000) if e.type == WAKE_TYPE]
    except yoke.errors.StreamNotFound:
        return []


async def test_each_input_record_wakes_its_stream_once(fresh_url, tenant, tmp_path):
    async with yoke.open(fresh_url) as y:
        inputs = y.stream("/runs/r1/input", tenant)
        waiting = y.stream("/runs/r1", tenant).tail(after=0)
        results = await inputs.append_input(
            [{"type": "q", "payload": {"n": 1}}, {"type": "q", "payload": {"n": 2}, "idempotency_key": "k2"}],
            wake="/runs/r1",
        )
        got = [await anext(waiting), await anext(waiting)]
        await waiting.aclose()
        info = await inputs.info()
        assert [(e.type, e.payload["sequence"], e.payload["record_id"]) for e in got] == [
            (WAKE_TYPE, r.offset, r.id) for r in results
        ]
        assert [e.id for e in got] == [wake_id(info.stream_id, r.offset) for r in results]
        assert [e.idempotency_key for e in got] == [wake_key(info.stream_id, r.offset) for r in results]
        # A retried record (same key) is the same record: no second wake.
        again = await inputs.append_input([{"type": "q", "payload": {"n": 2}, "idempotency_key": "k2"}], wake="/runs/r1")
        assert again[0].offset == results[1].offset
        await y.inputs.dispatch_once()
        assert len(await wakes(y, tenant, "/runs/r1")) == 2
        assert await y.store.outbox.due(2**62, 100) == []
        # A refused batch writes neither records nor outbox rows.
        await inputs.close()
        with pytest.raises(yoke.errors.StreamClosed):
            await inputs.append_input([{"type": "q"}], wake="/runs/r1")
        assert await y.store.outbox.due(2**62, 100) == []
        with pytest.raises(yoke.errors.InvalidInput):
            await y.stream("/runs/r1/other", tenant).append_input([{"type": "q", "ephemeral": True}], wake="/runs/r1")


async def test_publishing_again_duplicates_nothing(fresh_url, tenant):
    """A crash after the publish, before the row's deletion: publishing the
    same row again (here by hand, as the next dispatcher would) finds the
    wake event's key and returns the original."""
    async with yoke.open(fresh_url, input_dispatch_s=0) as y:
        await y.stream("/runs/r2/input", tenant).append_input([{"type": "q"}], wake="/runs/r2")
        [row] = await y.store.outbox.due(2**62, 100)
        await y.inputs.publish(row)
        await y.inputs.publish(row)  # the row was never deleted
        assert len(await y.store.outbox.due(2**62, 100)) == 1
        await y.inputs.dispatch_once()
        [wake] = await wakes(y, tenant, "/runs/r2")
        assert wake.offset == 1 and wake.id == wake_id(row.lifetime_id, row.offset)
        assert await y.store.outbox.due(2**62, 100) == []


async def test_the_wake_reaches_a_waiting_actor(fresh_url, tenant, tmp_path):
    app = App()
    woken: list[int] = []

    @app.actor("run", filter=Filter(types=[WAKE_TYPE], streams=["/runs/*"]))
    async def run(ctx, event):
        woken.append(event.payload["sequence"])

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(tenant).create("run", key="r3")
        await y.stream("/runs/r3/input", tenant).append_input([{"type": "q"}, {"type": "q"}], wake="/runs/r3")
        deadline = asyncio.get_running_loop().time() + 30
        while len(woken) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await y.wait_idle(timeout_s=30)
    assert sorted(woken) == [1, 2]


@pytest.mark.parametrize("dispatch_s", [0, 0.001])
async def test_a_writer_killed_mid_run_loses_and_duplicates_no_wake(fresh_url, tenant, dispatch_s):
    """The writer appends input records as fast as it can and is killed
    with SIGKILL after a few dozen: between a commit and its publish (it
    never publishes with dispatch_s 0), or anywhere in its own dispatch.
    Another process's dispatcher then publishes exactly one wake event per
    committed record."""
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.contract.input_writer", fresh_url, tenant, str(dispatch_s)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert writer.stdout is not None
        seen = 0
        while seen < 30:
            line = writer.stdout.readline()
            assert line.startswith("committed"), line
            seen += 1
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    async with yoke.open(fresh_url) as y:
        records = await y.stream("/runs/crash/input", tenant).read(limit=10_000)
        assert len(records) >= 30
        deadline = asyncio.get_running_loop().time() + 30
        while await y.store.outbox.due(2**62, 100) and asyncio.get_running_loop().time() < deadline:
            await y.inputs.dispatch_once()
        assert await y.store.outbox.due(2**62, 100) == []
        got = await wakes(y, tenant, "/runs/crash")
        assert sorted(e.payload["sequence"] for e in got) == [r.offset for r in records]
        assert sorted(e.payload["record_id"] for e in got) == sorted(r.id for r in records)


async def test_deleting_the_input_stream_drops_its_unpublished_rows(fresh_url, tenant):
    async with yoke.open(fresh_url, input_dispatch_s=0) as y:
        stream = y.stream("/runs/r4/input", tenant)
        await stream.append_input([{"type": "q"}], wake="/runs/r4")
        assert len(await y.store.outbox.due(2**62, 100)) == 1
        await stream.delete()
        assert await y.store.outbox.due(2**62, 100) == []
