"""``Batch``: what one delivery sends to a receiver (a value, nothing else).

Events of one subscription's run, with the run's coordinates: the source
stream's lifetime, the configuration generation and the attempt. Every
receiver (copy, webhook, call, processor) takes it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..events import Event


@dataclass(frozen=True)
class Batch:
    """What one delivery sends: events of one subscription's run."""

    tenant: str
    path: str
    name: str
    stream_id: str
    created_at: int
    generation: int
    attempt: int
    events: list[Event]

    @property
    def delivery_id(self) -> str:
        return f"{self.stream_id}:{self.generation}:{self.events[0].offset}-{self.events[-1].offset}"

    def lifetime(self) -> dict[str, Any]:
        """The run that produced the batch, for a receiver to fence a
        superseded one (the receiver's passive fence): the source
        stream's lifetime (``stream_id``, ``stream_created_at``) and the
        configuration generation (the configure or cursor_set offset)."""
        return {"stream_id": self.stream_id, "stream_created_at": self.created_at, "generation": self.generation}

    def to_dict(self) -> dict[str, Any]:
        """What a ``call`` receiver gets."""
        return {
            "events": [e.to_dict() for e in self.events], "path": self.path, "name": self.name,
            **self.lifetime(), "attempt": self.attempt, "delivery_id": self.delivery_id,
        }
