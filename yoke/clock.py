"""The clock: where every component reads the time.

Components take a ``Clock`` instead of calling ``time.time()`` or
``time.monotonic()`` themselves, so a test (or a virtual-time run) can hand
them another one. ``wall()`` is seconds since the epoch (what is stored and
shown); ``monotonic()`` measures intervals and deadlines (never goes back).
``SYSTEM`` is the real clock, the default everywhere; the composition root
(``runtime.py``) hands its one clock to the stores and the components.

Imports nothing of Yoke.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    __slots__ = ()

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM: Clock = SystemClock()


def wall_ms(clock: Clock) -> int:
    """``clock``'s wall time in whole milliseconds: how times are stored
    (created_at, leases, expiries, schedules)."""
    return int(clock.wall() * 1000)
