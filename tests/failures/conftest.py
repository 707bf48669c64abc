"""A real ``yoke serve --app tests.failures.app:app`` per backend, on a
database of its own, with fast retries (a subscription halts in well under
a second); each test works in a tenant of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ..http.conftest import CONSOLE_FAST, Server, own_database, start_server, stop_server

APP = "tests.failures.app:app"
# The console's fast settings, and faster subscription retries still: a copy halts (15 attempts) at once.
FAST = {
    **CONSOLE_FAST,
    "YOKE_SUBSCRIPTION_SWEEP_S": "0.05",
    "YOKE_SUBSCRIPTION_RETRY_BASE_S": "0.005",
    "YOKE_SUBSCRIPTION_RETRY_MAX_S": "0.01",
}


@dataclass
class Served:
    server: Server
    received: Path  # the rec receiver's log (tests/failures/app.py)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("failures")
    received = base / "received.jsonl"
    with own_database(request.param, base, "yoke_failures") as db_url:
        srv = start_server(db_url, base / ".yoke", args=("--app", APP), FAILURES_RECEIVED=str(received), **FAST)
        try:
            yield Served(srv, received)
        finally:
            stop_server(srv)


@pytest.fixture
def tenant() -> str:
    return "f" + uuid.uuid4().hex[:12]


@pytest.fixture
def admin(served: Served, tenant: str) -> Iterator[httpx.Client]:
    with served.server.client(served.server.new_token(tenant, "admin")) as client:
        yield client
