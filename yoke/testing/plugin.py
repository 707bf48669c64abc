"""The pytest plugin (registered by Yoke's ``pytest11`` entry point): the
``yoke_env`` fixture, a ``yoke.testing.env`` for each test.

The application comes from, first to last: the test's ``yoke_app`` marker
(``@pytest.mark.yoke_app("pkg.module:app", postgres=True, start=...)``, an
``App`` or its ``"module:attribute"``, and ``env`` keywords), a fixture
named ``yoke_app`` the project defines, the ``--yoke-app`` option, the
``yoke_app`` ini setting. ``--yoke-auto-advance`` runs every environment
with auto-advance on (a suite written with ``advance`` passes both ways).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from .environment import Environment, env

try:  # pytest-asyncio in strict mode takes only its own decorator
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pragma: no cover - another async plugin handles async fixtures
    async_fixture = pytest.fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("yoke")
    group.addoption("--yoke-app", default=None, help="the application yoke_env runs (module:attribute)")
    group.addoption("--yoke-auto-advance", action="store_true", default=False,
                    help="run every yoke_env with auto-advance on")
    parser.addini("yoke_app", "the application yoke_env runs (module:attribute)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "yoke_app(app, **env_options): the application yoke_env runs, and env() keywords"
    )


@pytest.fixture
def yoke_env_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What ``yoke_env`` is opened with: the app and ``env()`` keywords
    (resolved here, outside the event loop: a ``yoke_app`` fixture may
    depend on async fixtures of its own)."""
    options: dict[str, Any] = {}
    app: Any = None
    marker = request.node.get_closest_marker("yoke_app")
    if marker is not None:
        options = dict(marker.kwargs)
        app = marker.args[0] if marker.args else options.pop("app", None)
    if app is None:
        try:
            app = request.getfixturevalue("yoke_app")
        except pytest.FixtureLookupError:
            pass
    options["app"] = app or request.config.getoption("--yoke-app") or request.config.getini("yoke_app") or None
    if request.config.getoption("--yoke-auto-advance"):
        options.setdefault("auto_advance", True)
    return options


@async_fixture
async def yoke_env(yoke_env_options: dict[str, Any]) -> AsyncIterator[Environment]:
    """The real Yoke runtime with the test's application on a temporary
    database, under a virtual clock (``yoke.testing.Environment``)."""
    async with env(**yoke_env_options) as environment:
        yield environment
