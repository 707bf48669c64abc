"""One build of this checkout at a time: setuptools writes `yoke.egg-info`
(and `build/`) into the source tree, and the wheel and container tests may
run at once in different test processes."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def building_the_checkout() -> Iterator[None]:
    lock = ROOT / "build" / ".tests-building.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
