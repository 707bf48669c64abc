"""A run's tape: what it did and read outside its own database.

A run's state changes are recomputed when it is replayed; what it did to
the world and read from it is not. So every run records, in call order, its
effect ops (appends, schedules, children, conversation posts) and its reads
of the outside world (portal calls, schedule and message listings) with the
answer each got (or the error it raised), and its clock readings. The tape
is kept with the run's input (store/inputs.py) when the run ends, and is
what a fork answers those ops from (docs/advanced/forks.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from .. import errors
from .journal import EFFECT_OPS

# Reads whose answers come from outside the instance.
OUTSIDE_READS = frozenset({"portal_call", "schedules_list", "conversations_messages"})
TAPED_OPS = EFFECT_OPS | OUTSIDE_READS
MAX_READINGS = 1000  # clock readings kept per run (a run reading it in a loop keeps the first)


class Tape:
    """The tape of one run attempt."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.now: list[float] = []
        self.seed: int | None = None  # ctx.random()'s

    def op(self, method: str, params: dict[str, Any], answer: Any) -> None:
        self.ops.append({"op": method, "params": params, "answer": answer})

    def failed(self, method: str, params: dict[str, Any], exc: BaseException) -> None:
        if isinstance(exc, errors.YokeError):
            error = {"code": exc.code, "message": exc.message}
        else:
            error = {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}
        self.ops.append({"op": method, "params": params, "error": error})

    def reading(self, now: float) -> float:
        if len(self.now) < MAX_READINGS:
            self.now.append(now)
        return now

    def json(self) -> str | None:
        """As kept with the input (None: the run did nothing outside)."""
        if not self.ops and not self.now and self.seed is None:
            return None
        tape: dict[str, Any] = {"ops": self.ops, "now": self.now}
        if self.seed is not None:
            tape["seed"] = self.seed
        return orjson.dumps(tape).decode()
