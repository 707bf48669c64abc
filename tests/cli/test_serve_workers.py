"""``yoke serve --workers N``: N processes on one port and one PostgreSQL
database, seen from outside: connections spread over them, every append
lands once in one order, a tail on one process sees appends made through
the others, and stopping (or killing) the first process ends them all."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import yoke
from tests.http.conftest import Server, own_database, start_server, stop_server

WORKERS = 3


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def eventually(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Poll state another process owns (it cannot notify this one)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def connection_owners(port: int, pids: list[int]) -> dict[int, int]:
    """How many established connections to ``port`` each process holds
    (socket inodes of /proc/net/tcp matched to the processes' descriptors)."""
    inodes: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":  # local port, ESTABLISHED
            inodes.add(fields[9])
    owners = {}
    for pid in pids:
        held = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held += 1
        owners[pid] = held
    return owners


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Server]:
    with own_database("postgres", tmp_path, "yoke_workers") as db_url:
        server = start_server(db_url, tmp_path / ".yoke", args=("--workers", str(WORKERS)))
        try:
            eventually(lambda: len(children(server.process.pid)) == WORKERS - 1, "the workers to fork")
            yield server
        finally:
            stop_server(server)


def test_workers_share_the_port_and_the_streams(workers: Server) -> None:
    port = int(workers.url.rsplit(":", 1)[1])
    pids = [workers.process.pid, *children(workers.process.pid)]
    headers = {"Authorization": f"Bearer {workers.token}"}
    with httpx.Client(base_url=workers.url, headers=headers, timeout=10) as tail_client, \
            tail_client.stream("GET", "/v1/streams/shared/-/tail?after=0") as tail:
        clients = [httpx.Client(base_url=workers.url, headers=headers, timeout=10) for _ in range(24)]
        try:
            offsets = []
            for i, client in enumerate(clients):  # each client keeps its own connection open
                answer = client.post("/v1/streams/shared/-/events", json={"type": "n", "payload": {"i": i}})
                assert answer.status_code == 201, answer.text
                offsets.append(answer.json()["offset"])
            serving = [pid for pid, held in connection_owners(port, pids).items() if held]
            assert len(serving) >= 2, f"every connection went to one process: {connection_owners(port, pids)}"
        finally:
            for client in clients:
                client.close()
        assert sorted(offsets) == list(range(1, 25))
        seen = []
        for line in tail.iter_lines():
            if line.startswith("id:"):
                seen.append(int(line[3:]))
            if len(seen) == 24:
                break
        assert seen == list(range(1, 25))


def test_stopping_the_first_process_stops_every_worker(workers: Server) -> None:
    pids = children(workers.process.pid)
    assert stop_server(workers) == -signal.SIGTERM  # as one process ends on SIGTERM
    assert not any(alive(pid) for pid in pids)  # stopped before the first process ended


def test_killing_the_first_process_stops_every_worker(workers: Server) -> None:
    pids = children(workers.process.pid)
    workers.process.send_signal(signal.SIGKILL)
    workers.process.wait()
    eventually(lambda: not any(alive(pid) for pid in pids), "the orphaned workers to stop")


def test_workers_need_postgresql(tmp_path: Path) -> None:
    done = yoke("serve", "--workers", "2", "--port", "0", cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "--workers needs PostgreSQL" in done.stderr
    assert not (tmp_path / ".yoke" / "yoke.db").exists()
