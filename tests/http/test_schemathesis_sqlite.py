"""Schemathesis against a ``yoke serve`` on SQLite (fuzz_api.py: what is
generated, steered and checked)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import Server
from .fuzz_api import _pytest9_node_id, api_schema, fuzzed_server, test_no_server_errors  # noqa: F401 - collected here


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from fuzzed_server("sqlite", request, tmp_path_factory)
