"""Retention: a background loop that runs pruning passes.

The store does the work (``Store.prune``): per stream, remove events older
than ``max_age_s`` or beyond the newest ``max_events``, unless the stream is
under legal hold, and raise ``pruned_through`` so reads below it get
``CursorGone``.
"""

from __future__ import annotations

import asyncio
import logging

from ..clock import SYSTEM, Clock, wall_ms
from ..store.contract import Store
from ..store.faults import log_retried

log = logging.getLogger("yoke.streams.retention")


async def prune_once(store: Store, clock: Clock = SYSTEM) -> int:
    """One pass: prune events, then remove aborted and expired uncommitted
    objects (ages and expiries by ``clock``, the runtime's)."""
    removed = await store.prune(wall_ms(clock))
    await store.cleanup_objects(wall_ms(clock))
    return removed


async def prune_forever(store: Store, interval_s: float, clock: Clock = SYSTEM) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            removed = await prune_once(store, clock)
            if removed:
                log.info("retention removed %d events", removed)
        except Exception:  # keep the loop alive; the next pass retries
            log_retried(log, "retention pass failed")
