"""Actors in host processes (docs/advanced/hosts.md): ops cross a unix socket, and a
handler that raises, exits, crashes, hangs, spins or grows costs its own
run only. The application is tests/actors/isolated_app.py (hosts import it)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import yoke
from tests.actors.isolated_app import app

WAIT_S = 120.0


def open_runtime(url: str, tmp_path, **settings):
    settings.setdefault("host_processes", 3)
    return yoke.open(url, app=app, data_dir=str(tmp_path), shutdown_timeout_s=2, **settings)


async def eventually(check, timeout_s: float = WAIT_S):
    """Poll ``check()`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s}s: {check}")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_ops_cross_to_a_host(fresh_url: str, tmp_path) -> None:
    async with open_runtime(fresh_url, tmp_path) as y:
        inst = await y.instances("acme").create("echo", key="a")
        for n in range(3):
            await y.stream("/", "acme").append({"type": "echo", "payload": {"n": n}})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await y.instances("acme").state(inst.instance_id)
        assert state["count"] == 3 and state["pid"] != os.getpid()
        out = await y.stream("/out", "acme").read(after=0)
        assert [e.payload["n"] for e in out] == [0, 1, 2]
        assert out[0].source == {"actor": "echo", "instance": inst.instance_id}
        host_pid = state["pid"]
        assert alive(host_pid)
    assert not alive(host_pid)  # closing the runtime ends its hosts


async def test_worker_default_isolation(fresh_url: str, tmp_path) -> None:
    async with open_runtime(fresh_url, tmp_path, isolation="process") as y:
        inst = await y.instances("acme").create("plain", key="a")
        await y.stream("/", "acme").append({"type": "plain"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await y.instances("acme").state(inst.instance_id)
        assert state["pid"] != os.getpid()
    async with open_runtime(fresh_url, tmp_path) as y:  # the default: in-process
        await y.stream("/", "acme").append({"type": "plain"})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await y.instances("acme").state(inst.instance_id)
        assert state["pid"] == os.getpid()


def test_isolation_values_checked() -> None:
    with pytest.raises(yoke.errors.InvalidInput):
        yoke.App().actor("a", isolation="thread")


REASONS = {
    "raise": "ValueError: asked to fail",
    "exit": "host failure: its host exited with status 7",
    "segfault": "host failure: its host died of SIGSEGV",
    "kill": "host failure: its host died of SIGKILL",
    "hang": "process() timed out after 3s; its host was killed",
    "spin": "process() timed out after 3s; its host was killed",
    "sleep": "process() timed out after 3s; its host was killed",
    "allocate": "host failure: MemoryError: the host's memory limit (128 MiB) was reached",
}


@pytest.mark.parametrize("what", list(REASONS))
async def test_a_failing_run_is_retried_and_recorded(fresh_url: str, tmp_path, what: str) -> None:
    """The row is tried max_attempts (2) times, each attempt counted, the
    reason recorded; the host is replaced unless the handler only raised;
    another instance's events are processed all along."""
    async with open_runtime(fresh_url, tmp_path, host_memory_mb=128) as y:
        instances = y.instances("acme")
        actor = "grower" if what == "allocate" else "worker"
        bad = await instances.create(actor, key="bad", filter={"types": ["bad"]})
        good = await instances.create("patient", key="good", filter={"types": ["good"]})
        pool = y.executor.hosts
        await y.stream("/", "acme").append({"type": "bad", "payload": {"what": what}})
        for _ in range(5):
            await y.stream("/", "acme").append({"type": "good"})
        dead = await eventually(lambda: instances.dead(bad.instance_id))
        assert dead[0].attempts == 2
        assert dead[0].last_error.startswith(REASONS[what]), dead[0].last_error
        if what == "raise":
            assert "asked to fail" in dead[0].last_traceback  # the host's traceback
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(good.instance_id)
        assert state["done"] == 5
        # A host was started per failed attempt (a raise keeps its host).
        replaced = 0 if what == "raise" else 2
        assert pool.started >= 1 + replaced
        if what != "raise":
            assert pool.started - len(pool.hosts) >= replaced


async def test_a_spinning_handler_does_not_stop_the_others(fresh_url: str, tmp_path) -> None:
    """While one host spins (timeout 120 s), other instances' events are
    processed; shutting down kills the spinning host."""
    async with open_runtime(fresh_url, tmp_path) as y:
        instances = y.instances("acme")
        bad = await instances.create("patient", key="bad", filter={"types": ["bad"]})
        good = await instances.create("patient", key="good", filter={"types": ["good"]})
        await y.stream("/", "acme").append({"type": "bad", "payload": {"what": "spin"}})
        await eventually(lambda: instances.queue(bad.instance_id, status="processing"))
        for _ in range(5):
            await y.stream("/", "acme").append({"type": "good"})

        async def good_done():
            state, _ = await instances.state(good.instance_id)
            return state is not None and state.get("done") == 5

        await eventually(good_done)
        (row,) = await instances.queue(bad.instance_id)
        assert row.status == "processing" and row.attempts == 1  # still spinning
        pids = {h.pid for h in y.executor.hosts.hosts}
    for pid in pids:
        assert not alive(pid)


async def test_a_host_cannot_reach_the_runtime(fresh_url: str, tmp_path) -> None:
    """Walk everything ctx hands out (attributes and gc referents), and the
    host's whole heap: no runtime, store, database connection or op
    handler; no op reads a stream; no database settings in the environment."""
    os.environ["YOKE_SECRET_FOR_TEST"] = "x"
    try:
        async with open_runtime(fresh_url, tmp_path) as y:
            inst = await y.instances("acme").create("snoop", key="a")
            await y.stream("/", "acme").append({"type": "snoop"})
            await y.wait_idle(timeout_s=WAIT_S)
            state, _ = await y.instances("acme").state(inst.instance_id)
    finally:
        del os.environ["YOKE_SECRET_FOR_TEST"]
    assert state["pid"] != os.getpid()
    assert state["reached"] > 1000  # the walk went far: modules, the loop, the socket
    assert state["found"] == [] and state["everywhere"] == []
    assert state["modules"] == []  # no database driver, no runtime module loaded
    assert state["env"] == []
    assert set(state["refused"].values()) == {"invalid_input"}  # unknown op


def test_yoke_serve_isolation_flag(fresh_url: str, tmp_path) -> None:
    """`yoke serve --app ... --isolation process` runs actors that name no
    isolation in hosts; SIGTERM ends its hosts with it."""
    from pathlib import Path

    from tests.http.conftest import events_url, start_server, stop_server

    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(fresh_url, data, args=("--app", "tests.actors.isolated_app:app", "--isolation", "process"),
                          PYTHONPATH=str(root))
    try:
        with server.client() as http:
            created = http.post("/v1/instances", json={"actor": "plain", "key": "a"})
            assert created.status_code == 201, created.text
            assert http.post(events_url("/"), json={"type": "plain", "payload": {"out": True}}).status_code == 201
            deadline = time.monotonic() + WAIT_S
            while True:
                page = http.get(events_url("/plain-out"), params={"after": 0}).json()
                if page.get("events"):
                    break
                assert time.monotonic() < deadline, page
                time.sleep(0.05)
        pid = page["events"][0]["payload"]["pid"]
        assert pid not in (server.process.pid, os.getpid()) and alive(pid)
    finally:
        stop_server(server)  # graceful: uvicorn ends by raising SIGTERM again
    assert not alive(pid)


async def test_runs_share_a_host_when_allowed(fresh_url: str, tmp_path) -> None:
    """host_runs=3, one host: the three instances' runs all go to it."""
    async with open_runtime(fresh_url, tmp_path, host_processes=1, host_runs=3) as y:
        ids = [(await y.instances("acme").create("echo", key=k)).instance_id for k in "abc"]
        await y.stream("/", "acme").append({"type": "echo", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=WAIT_S)
        pids = {(await y.instances("acme").state(i))[0]["pid"] for i in ids}
        assert len(pids) == 1 and os.getpid() not in pids
        assert y.executor.hosts.started == 1
