"""Helpers shared by the subscription tests. Every test runs on a database
of its own (``fresh_url``): a delivery engine claims the subscriptions of its
whole database."""

from __future__ import annotations

import asyncio

# Settings that make the retry clock fast (no test sleeps through a backoff).
FAST = {
    "subscription_sweep_s": 0.05,
    "subscription_retry_base_s": 0.001,
    "subscription_retry_max_s": 0.005,
}


def copying(y):  # noqa: ANN001, ANN201
    """What ``copy.send`` needs, built from the runtime's parts (as its
    deliveries build it; a runtime opened with ``executor=False`` has none)."""
    from yoke.subscriptions.copies import Copying

    return Copying(lambda: y.store, y.appends, y.stream, y.settings.max_event_bytes)


async def control_events(stream, after: int = 0) -> list:  # noqa: ANN001
    """The first-hand ``yoke.subscription.*`` events of a stream."""
    return [e for e in await stream.read(after=after, limit=10_000) if e.type.startswith("yoke.subscription.")]


async def until(fetch, done, timeout_s: float = 15.0):  # noqa: ANN001, ANN201
    """Poll ``fetch()`` until ``done`` holds (delivery runs in the background)."""
    async with asyncio.timeout(timeout_s):
        while True:
            value = await fetch()
            if done(value):
                return value
            await asyncio.sleep(0.02)
