"""In-process wake-ups for tails.

A wake-up only says "stream (tenant, path) may have new events; reread".
Appends in this process wake after their commit; the PostgreSQL listener
forwards appends from other processes. A waiter subscribes *before* its
backfill read, and its flag stays set until it next waits, so a wake-up
that lands during the read is never lost.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

Key = tuple[str, str]


class Waiter:
    __slots__ = ("_flag", "_hub", "_key", "_cause", "sweeps")

    def __init__(self, hub: WakeupHub, key: Key, sweeps: bool = True) -> None:
        self._hub = hub
        self._key = key
        self._flag = asyncio.Event()
        self._cause: str | None = None
        self.sweeps = sweeps  # woken by the hub's periodic sweep too

    def wake(self, cause: str = "notify") -> None:
        """``cause``: "notify" (news of this stream) wins over "sweep" (the
        periodic reread) and "resync" (notifications may have been lost)."""
        if self._cause != "notify":
            self._cause = cause
        self._flag.set()

    async def wait(self) -> str:
        """Wait for a wake-up: an append, or the hub's periodic sweep; says which."""
        await self._flag.wait()
        self._flag.clear()
        cause, self._cause = self._cause or "notify", None
        return cause

    def close(self) -> None:
        self._hub._remove(self)


class WakeupHub:
    """Waiters per stream. ``sweep_forever`` wakes every waiter periodically,
    one timer for all of them, so a lost notification costs at most one
    sweep interval of latency."""

    def __init__(self) -> None:
        self._waiters: dict[Key, set[Waiter]] = defaultdict(set)
        # Counts wake-ups (all streams). A read that starts at clock c sees
        # every commit announced by a wake-up numbered <= c.
        self.clock = 0
        # Fan-out follows appends through these: observers get (tenant, path)
        # on every wake-up, resync observers a call after a reconnect.
        self.observers: list[Callable[[str, str], None]] = []
        self.resync_observers: list[Callable[[], None]] = []

    def subscribe(self, tenant: str, path: str, *, sweeps: bool = True) -> Waiter:
        """A waiter for the stream's wake-ups. ``sweeps=False``: not for the
        periodic sweep (a reader with a safety net of its own: an idle
        subscription's runner costs nothing between appends)."""
        waiter = Waiter(self, (tenant, path), sweeps)
        self._waiters[(tenant, path)].add(waiter)
        return waiter

    @property
    def waiters(self) -> int:
        """Waiters subscribed now (each tail, blocked producer, delivery)."""
        return sum(len(waiters) for waiters in self._waiters.values())

    @property
    def streams(self) -> int:
        """Streams with at least one waiter."""
        return len(self._waiters)

    def wake(self, tenant: str, path: str) -> None:
        self.clock += 1
        for waiter in self._waiters.get((tenant, path), ()):
            waiter.wake()
        for observer in self.observers:
            observer(tenant, path)

    def wake_waiters(self, tenant: str, path: str) -> None:
        """Wake the stream's readers only: news for readers, not for fan-out
        (an ephemeral event relayed from another process)."""
        self.clock += 1
        for waiter in self._waiters.get((tenant, path), ()):
            waiter.wake()

    def wake_all(self, cause: str = "notify") -> None:
        self.clock += 1
        sweep = cause == "sweep"
        for waiters in self._waiters.values():
            for waiter in waiters:
                if waiter.sweeps or not sweep:
                    waiter.wake(cause)

    def resync(self) -> None:
        """Notifications may have been lost (a reconnect): every reader rereads."""
        self.wake_all("resync")
        for observer in self.resync_observers:
            observer()

    async def sweep_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.wake_all("sweep")

    def _remove(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter._key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter._key]
