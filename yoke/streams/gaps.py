"""Evidence of repaired live gaps (gap evidence: a live gap is repaired
from the store, and the repair is recorded).

A tail learns of new events through wake-ups (this process's appends, and
on PostgreSQL the NOTIFY of other processes' commits); it also rereads the
store every ``tail_sweep_s`` and after a listener reconnect, so a lost
notification delays events but never loses them. When such a reread (not a
wake-up for the stream) finds events committed more than ``GAP_AGE_MS``
earlier, the live channel missed them: a gap, repaired from the store. It
leaves three kinds of evidence: the counter
``yoke_tail_gaps_repaired_total{cause}``, a warning log line, and a row for
operators (``Stream.gaps()``, ``GET .../gaps``; the newest 100 per stream),
written once per stream and gap even when many tails find it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import OrderedDict

from .. import metrics
from ..clock import SYSTEM, Clock, wall_ms
from ..events import Event
from ..store import OpenStore
from ..store.faults import log_retried

log = logging.getLogger("yoke.streams.gaps")

# Younger events may simply have committed between the reread and their own
# notification: not evidence of anything.
GAP_AGE_MS = 500
MAX_SEEN = 10_000
PROCESS = f"{socket.gethostname()}:{os.getpid()}"


class Gaps:
    def __init__(self, store: OpenStore, clock: Clock = SYSTEM) -> None:
        self._store = store
        self._clock = clock  # how late an event is, by the time it was stamped with
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()  # stream -> last offset recorded
        self._writes: set[asyncio.Task[None]] = set()
        self.repaired = 0

    def check(self, tenant: str, path: str, cause: str, events: list[Event]) -> None:
        """A reread caused by ``cause`` ("sweep" or "resync") found ``events``."""
        durable = [e for e in events if not e.ephemeral]
        if not durable:
            return
        now = wall_ms(self._clock)
        late = [e for e in durable if e.at < now - GAP_AGE_MS]
        if not late:
            return
        key = (tenant, path)
        if self._seen.get(key, 0) >= late[-1].offset:
            return  # another tail of this process found it first
        self._seen[key] = late[-1].offset
        self._seen.move_to_end(key)
        while len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        first, last = late[0].offset, late[-1].offset
        self.repaired += 1
        metrics.GAPS_REPAIRED.labels(cause).inc()
        log.warning(
            "live gap repaired: %s %s offsets %d-%d were found by a %s reread, %d ms after their commit,"
            " without a wake-up", tenant, path, first, last, cause, now - late[0].at,
        )
        task = asyncio.ensure_future(self._record(tenant, path, first, last, cause, now))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _record(self, tenant: str, path: str, first: int, last: int, cause: str, at: int) -> None:
        try:
            await self._store().record_gap(tenant, path, first, last, cause, at, PROCESS)
        except Exception:
            log_retried(log, "recording the gap evidence of %s %s failed", tenant, path)
