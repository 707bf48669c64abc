"""Test only: named points of the atomic commit where a test kills this
process (tests/faults/test_atomic_kill9.py). ``YOKE_TEST_CRASH_AT=<point>:<n>``
sends SIGKILL to this process the n-th time a commit reaches <point>;
unset (always, outside that test), ``reached`` does nothing."""

from __future__ import annotations

import os
import signal

_CRASH_AT = os.environ.get("YOKE_TEST_CRASH_AT", "")
_hits: dict[str, int] = {}


def reached(point: str) -> None:
    if _CRASH_AT:
        _hits[point] = _hits.get(point, 0) + 1
        if _CRASH_AT == f"{point}:{_hits[point]}":
            os.kill(os.getpid(), signal.SIGKILL)
