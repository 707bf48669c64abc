"""Evaluations: where filter expressions run, so that none holds the event loop.

Every caller of JSONata on events (tails' ``where=``, subscriptions' filters
and transforms, fan-out's routes and keys) goes through here.

- A *light* expression (cost.py) runs on the event loop, as it costs
  microseconds: a pool round trip would cost more.
- An *expensive* one runs in the evaluator processes (pool.py), tenants
  taking turns. A thread would not do: the loop thread waits for the GIL
  whenever another thread runs Python (a JSONata evaluation in one thread
  made a loop round trip take 5 ms at p50 and 21 ms at p99, 184 ms with four
  threads; a ``regex`` match holds the GIL for its whole time bound unless
  asked not to), and jsonata-python is pure Python.
- A light expression that turns out slow on its events goes there too: one
  that took more than ``SLOW_S`` of CPU on two events in a row, or was cut
  off at ``INLINE_CUT_MS`` of CPU on the loop twice, is sent to the
  processes for
  ``SLOW_FOR_S`` (per tenant and expression: a slow one is often slow only
  on one tenant's events). An event cut off runs again in a process.
- A batch of light evaluations hands the loop back to its other work every
  ``BATCH_S`` (a tail's page of 1,000 events takes about 15 ms). Sending
  the rest to the processes instead made a cheap filter's backfill a third
  slower (bench/filters.py): the round trip, and one process per tenant.

So one caller holds the loop for at most about ``BATCH_S`` plus one
evaluation (at most ``INLINE_CUT_MS``, usually microseconds) at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..clock import SYSTEM, Clock
from ..events import Event
from .cost import expensive
from .filters import Filter, cut_off, failure, outcome, path_matches
from .pool import EvaluatorPool

SLOW_S = 0.001
INLINE_CUT_MS = 3
SLOW_FOR_S = 60.0
BATCH_S = 0.002
MAX_SLOW = 4096  # (tenant, expression) pairs remembered as slow


class Failed:
    """An expression's failure on one event (its message)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"Failed({self.message!r})"


class Evaluations:
    def __init__(self, processes: int, clock: Clock = SYSTEM) -> None:
        self.pool = EvaluatorPool(processes)
        self._clock = clock  # how long a slow expression stays off the loop
        self._slow: OrderedDict[tuple[str, str], float] = OrderedDict()  # -> until (monotonic)
        self._strikes: dict[tuple[str, str], int] = {}  # one slow evaluation, the last one

    def on_loop(self, tenant: str, expression: str) -> bool:
        """Does ``expression`` run on the event loop for ``tenant`` now?"""
        if expensive(expression):
            return False
        until = self._slow.get((tenant, expression))
        if until is None:
            return True
        if self._clock.monotonic() < until:
            return False
        del self._slow[(tenant, expression)]
        return True

    def _strike(self, tenant: str, expression: str) -> None:
        """An evaluation of ``expression`` was slow: the second in a row
        sends it to the processes (one alone may have been the garbage
        collector's young generation, about 1 ms, collected during it)."""
        key = (tenant, expression)
        if self._strikes.pop(key, 0) == 0:
            self._strikes[key] = 1
            if len(self._strikes) > MAX_SLOW:
                del self._strikes[next(iter(self._strikes))]
            return
        self._slow[key] = self._clock.monotonic() + SLOW_FOR_S
        self._slow.move_to_end(key)
        if len(self._slow) > MAX_SLOW:
            self._slow.popitem(last=False)

    async def run(
        self, tenant: str, expression: str, what: str, documents: Sequence[Any], *, stop_at_error: bool = False,
    ) -> list[Any]:
        """What ``expression`` gives on each document (filters.outcome), or a
        ``Failed``; in order, through the first failure when ``stop_at_error``."""
        results: list[Any] = []
        if documents and self.on_loop(tenant, expression):
            clock = time.thread_time
            started = last = clock()
            for document in documents:
                try:
                    results.append(_on_loop(expression, document, what))
                except _CutOff:
                    self._strike(tenant, expression)
                    break  # this event and the rest in a process, with the whole bound
                except Exception as exc:  # noqa: BLE001 - the expression's failure on this event
                    results.append(Failed(str(exc) or type(exc).__name__))
                    if stop_at_error:
                        return results
                now = clock()
                if now - last > SLOW_S:
                    self._strike(tenant, expression)
                    if not self.on_loop(tenant, expression):
                        break
                elif self._strikes:
                    self._strikes.pop((tenant, expression), None)
                if now - started > BATCH_S:
                    await asyncio.sleep(0)  # the loop's other work first
                    now = started = clock()
                last = now
            if len(results) == len(documents):
                return results
        rest = documents[len(results):]
        for ok, value in await self.pool.run(tenant, expression, what, list(rest), stop_at_error):
            results.append(value if ok else Failed(value))
        return results

    async def verdicts(self, tenant: str, event_filter: Filter, documents: Sequence[dict[str, Any]]) -> list[Any]:
        """For each event document: does ``event_filter`` keep it (types,
        streams, ``where``)? Through the first ``Failed``."""
        out: list[Any] = [_passes(event_filter, d["type"], d["path"]) for d in documents]
        if event_filter.where is None:
            return out
        asked = [i for i, keep in enumerate(out) if keep]
        answers = await self.run(tenant, event_filter.where, "where", [documents[i] for i in asked],
                                 stop_at_error=True)
        for i, answer in zip(asked, answers):
            out[i] = answer
            if type(answer) is Failed:
                return out[: i + 1]
        return out

    async def select(self, tenant: str, event_filter: Filter, events: list[Event]) -> list[Event]:
        """The events ``event_filter`` keeps; ``FilterError`` (filter_failed)
        at the first one its ``where`` fails on."""
        candidates = [e for e in events if _passes(event_filter, e.type, e.path)]
        if event_filter.where is None or not candidates:
            return candidates
        answers = await self.run(tenant, event_filter.where, "where", [e.to_dict() for e in candidates],
                                 stop_at_error=True)
        kept = []
        for event, answer in zip(candidates, answers):
            if type(answer) is Failed:
                raise failure("where", answer.message, event_filter.where)
            if answer:
                kept.append(event)
        return kept

    async def close(self) -> None:
        await self.pool.close()


class _CutOff(Exception):
    """An evaluation on the loop used INLINE_CUT_MS of CPU: it was cut off."""


def _on_loop(expression: str, document: Any, what: str) -> Any:
    try:
        return outcome(expression, document, what, INLINE_CUT_MS)
    except Exception as exc:
        if cut_off(exc):
            raise _CutOff from None
        raise


def _passes(event_filter: Filter, event_type: str, path: str) -> bool:
    """The filter's types and stream globs (no JSONata)."""
    return event_filter.matches_type(event_type) and (
        event_filter.streams is None or path_matches(event_filter.streams, path)
    )
