"""A ``yoke serve --dev`` per backend for the Durable Streams tests, and the
npm packages they run (installed by ``make test``: npm ci in this folder)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.conftest import Server, own_database, start_server, stop_server

HERE = Path(__file__).parent
# The long-poll timeout the server and the suite agree on (the suite waits it
# out in several tests: the protocol's 20 s default would take minutes).
LONG_POLL_S = 2


def node_modules() -> Path:
    modules = HERE / "node_modules"
    if shutil.which("node") is None or not (modules / "@durable-streams").is_dir():
        pytest.fail("the npm packages are missing: run `make test` (npm ci in tests/durable_streams)")
    return modules


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def dev_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("ds")
    with own_database(request.param, base, "yoke_ds") as db_url:
        server = start_server(
            db_url, base / ".yoke", args=("--dev",), YOKE_PROTOCOL_LONG_POLL_S=str(LONG_POLL_S),
            YOKE_PROTOCOL_SSE_MAX_S="10",
            # Some suite tests keep Node's event loop busy for seconds
            # between requests, so the client cannot see an idle connection
            # close and reuses it: keep idle connections longer than that.
            YOKE_HTTP_KEEP_ALIVE_S="75",
        )
        try:
            yield server
        finally:
            stop_server(server)
