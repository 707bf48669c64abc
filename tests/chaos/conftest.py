from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: kills worker processes while they run (PostgreSQL, about a minute)"
    )
