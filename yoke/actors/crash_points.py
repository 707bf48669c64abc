"""Test only: named points of the atomic commit where a test kills this
process (tests/faults/test_atomic_kill9.py). ``YOKE_TEST_CRASH_AT=<point>:<n>``
sends SIGKILL to this process the n-th time a commit reaches <point>;
unset (always, outside that test), ``reached`` does nothing. ``hook``, set
by an in-process test, is called with each point reached (on the thread
that reached it: some points are in the SQLite pool)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

hook: Callable[[str], None] | None = None
_CRASH_AT = os.environ.get("YOKE_TEST_CRASH_AT", "")
_hits: dict[str, int] = {}


def reached(point: str) -> None:
    if hook is not None:
        hook(point)
    if _CRASH_AT:
        _hits[point] = _hits.get(point, 0) + 1
        if _CRASH_AT == f"{point}:{_hits[point]}":
            os.kill(os.getpid(), signal.SIGKILL)
