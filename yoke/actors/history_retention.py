"""History retention: instances' kept inputs past their actor's bounds,
and forks past their expiry, deleted.

An actor declared with ``keep_inputs`` (the newest N per instance) or
``keep_inputs_s`` (none older than S seconds) has its instances' kept
inputs (store/inputs.py) pruned; actors without either keep everything
while the instance lives. Expired forks (store/forks.py) go too. Every
executor makes a pass every ``every_s`` on its clock, in slices of
``slice_rows`` rows (one short transaction each).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..store.faults import log_retried

if TYPE_CHECKING:
    from .app import ActorDef
    from .kernel import ActorKernel

log = logging.getLogger("yoke.actors.history_retention")

PRUNE_EVERY_S = 60.0
SLICE_ROWS = 1000


class HistoryRetention:
    def __init__(
        self, kernel: ActorKernel, actors: list[ActorDef], *, every_s: float = PRUNE_EVERY_S,
        slice_rows: int = SLICE_ROWS,
    ) -> None:
        self._kernel = kernel
        self.bounded = [a for a in actors if a.keep_inputs is not None or a.keep_inputs_s is not None]
        self.every_s = every_s
        self.slice_rows = slice_rows

    async def prune_once(self) -> int:
        """One pass over every tenant: the number of inputs and forks deleted."""
        deleted = 0
        now_ms = self._kernel.now_ms()
        for tenant in await self._kernel.actors().tenants():
            while (n := await self._kernel.forks().expire(tenant, now_ms, self.slice_rows)) > 0:
                deleted += n
                if n < self.slice_rows:
                    break
            for actor in self.bounded:
                if actor.keep_inputs == 0:  # its instances' histories have gaps from now on
                    await self._kernel.inputs().mark_incomplete(tenant, actor.name)
                before = None if actor.keep_inputs_s is None else now_ms - int(actor.keep_inputs_s * 1000)
                while True:
                    n = await self._kernel.inputs().prune(
                        tenant, actor.name, keep=actor.keep_inputs, before_ms=before, limit=self.slice_rows,
                    )
                    deleted += n
                    if n < self.slice_rows:
                        break
        return deleted

    async def run(self) -> None:
        clock = self._kernel.clock
        while True:
            # Real seconds, not an alarm on the clock: a test's virtual clock
            # moved by a week would stop at every pass on the way.
            try:
                async with clock.alarm(None, within=self.every_s):
                    await asyncio.Event().wait()  # the timeout ends the wait
            except TimeoutError:
                pass
            try:
                await self.prune_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "pruning kept inputs and forks failed; trying again next time")
