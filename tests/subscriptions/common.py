"""Helpers shared by the subscription tests. Every test runs on a database
of its own (``fresh_url``): a delivery engine claims the subscriptions of its
whole database."""

from __future__ import annotations

# Settings that make the retry clock fast (no test sleeps through a backoff).
FAST = {
    "subscription_sweep_s": 0.05,
    "subscription_retry_base_s": 0.001,
    "subscription_retry_max_s": 0.005,
}


async def control_events(stream, after: int = 0) -> list:  # noqa: ANN001
    """The first-hand ``yoke.subscription.*`` events of a stream."""
    return [e for e in await stream.read(after=after, limit=10_000) if e.type.startswith("yoke.subscription.")]
