"""The clock: where every component reads the time.

Components take a ``Clock`` instead of calling ``time.time()`` or
``time.monotonic()`` themselves, so a test (or a virtual-time run) can hand
them another one. ``wall()`` is seconds since the epoch (what is stored and
shown, and what due times are in); ``monotonic()`` measures intervals of real
work (leases, budgets, request deadlines: never goes back). ``alarm()`` is
how a component waits for a due time: an ``asyncio.timeout`` that expires
when the wall clock reaches it (or after some real seconds, for a periodic
safety net), so a clock that jumps wakes it. ``SYSTEM`` is the real clock,
the default everywhere; the composition root (``runtime.py``) hands its one
clock to the stores and the components. ``VirtualClock`` is the one a test
moves (``yoke.testing``).

Imports nothing of Yoke.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol


class Alarm(Protocol):
    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...


class Clock(Protocol):
    def wall(self) -> float: ...

    def monotonic(self) -> float: ...

    def alarm(self, at: float | None, *, within: float | None = None) -> Alarm:
        """An ``asyncio.timeout``: the body is cancelled and ``TimeoutError``
        raised when the wall clock reaches ``at`` (seconds since the epoch)
        or after ``within`` real seconds, whichever comes first (None: not
        by that one)."""
        ...


class SystemClock:
    __slots__ = ()

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def alarm(self, at: float | None, *, within: float | None = None) -> Alarm:
        delay = within
        if at is not None:
            delay = max(at - time.time(), 0.0) if delay is None else min(delay, max(at - time.time(), 0.0))
        return asyncio.timeout(delay)


SYSTEM: Clock = SystemClock()


def wall_ms(clock: Clock) -> int:
    """``clock``'s wall time in whole milliseconds: how times are stored
    (created_at, leases, expiries, schedules). A microsecond is added before
    truncating: a due time of ``x`` ms set as ``x / 1000`` s (a test's clock
    moved to it) must read back as ``x``, not ``x - 1`` (float error)."""
    return int(clock.wall() * 1000 + 0.001)


def backoff_s(attempt: int, base_s: float, max_s: float, *identity: object) -> float:
    """A retry's delay: ``base_s`` doubling with each ``attempt`` (1, 2, ...)
    up to ``max_s``, +-20%. The jitter spreads the retries of different
    things (``identity``: what is retried) and is the same for the same thing
    and attempt, so a run under a test's clock is repeatable."""
    jitter = random.Random(":".join(map(str, (*identity, attempt)))).uniform(0.8, 1.2)
    return min(base_s * 2 ** (attempt - 1), max_s) * jitter


async def sleep_until(clock: Clock, at: float | None, *, within: float | None = None) -> None:
    """Return when ``clock`` reaches ``at`` or after ``within`` real seconds."""
    with contextlib.suppress(TimeoutError):
        async with clock.alarm(at, within=within):
            await asyncio.get_running_loop().create_future()


class VirtualClock:
    """Wall time that stands still until ``set()`` moves it (forward only),
    waking the alarms it passed. Monotonic time stays real: it measures real
    work (a lease held by this process, a request's deadline), which a jump
    of the calendar must not expire. ``next_alarm()`` is the earliest wall
    time a component waits for: where a test's clock goes next."""

    stands_still = True  # between set()s: a host process's ctx.now() does not run on

    def __init__(self, start: float) -> None:
        self._now = float(start)
        self._alarms: dict[int, tuple[float, Callable[[], None]]] = {}
        self._ids = itertools.count()

    def wall(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return time.monotonic()

    def alarm(self, at: float | None, *, within: float | None = None) -> Alarm:
        return _VirtualAlarm(self, at, within)

    def next_alarm(self) -> float | None:
        """The earliest wall time an alarm waits for that is still ahead."""
        return min((at for at, _ in self._alarms.values() if at > self._now), default=None)

    def set(self, to: float) -> None:
        """Move wall time to ``to`` and wake every alarm it reached."""
        if to < self._now:
            raise ValueError(f"a virtual clock moves forward only ({to} < {self._now})")
        self._now = float(to)
        for at, wake in list(self._alarms.values()):
            if at <= self._now:
                wake()

    def _add(self, at: float, wake: Callable[[], None]) -> int:
        key = next(self._ids)
        self._alarms[key] = (at, wake)
        return key

    def _remove(self, key: int) -> None:
        self._alarms.pop(key, None)


class _VirtualAlarm:
    def __init__(self, clock: VirtualClock, at: float | None, within: float | None) -> None:
        self._clock = clock
        self._at = at
        self._timeout = asyncio.timeout(within)
        self._key: int | None = None

    async def __aenter__(self) -> object:
        timeout = await self._timeout.__aenter__()
        if self._at is not None:
            loop = asyncio.get_running_loop()

            def wake() -> None:
                if not timeout.expired():
                    timeout.reschedule(loop.time())

            if self._at <= self._clock.wall():
                wake()
            else:
                self._key = self._clock._add(self._at, wake)
        return timeout

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._key is not None:
            self._clock._remove(self._key)
        return await self._timeout.__aexit__(kind, exc, tb)
