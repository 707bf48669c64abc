"""An instance's inputs, kept: the contract and the values it passes.

Every queue row a run finished with (completed, or dead-lettered) is kept as
one of its instance's inputs, in the transaction that completes or buries
the row: the event as the run got it, which attempt ended it and how, when,
the code version that ran it, and the run's *tape*: what it did and read
outside its own database (effect ops with their answers, outside reads,
clock readings), which a fork replays from (docs/advanced/forks.md).

Inputs are numbered per instance (``seq``: 1, 2, ... in the order runs
ended) and kept while the instance lives, pruned by the actor's retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import orjson

# The type of a conversation message's event (actors/context.py's CONVERSATION_EVENT).
_MESSAGE_EVENT = "conversation.message.posted"


class Completion(NamedTuple):
    """A run that returned: queue row ``qid`` claimed at ``attempts`` goes,
    kept as an input finished at ``processed_at`` (ms; 0: the store's now)
    by code ``code_version``, with its ``tape`` (JSON text or None), unless
    ``keep`` is False (its actor keeps no inputs: ``keep_inputs=0``)."""

    qid: int
    attempts: int
    processed_at: int = 0
    code_version: str | None = None
    tape: str | None = None
    keep: bool = True


@dataclass(frozen=True, slots=True)
class InputRecord:
    tenant: str
    instance_id: str
    seq: int
    qid: int
    path: str | None  # the stream the event came from (None: sent to the instance directly)
    offset: int | None
    event: dict[str, Any]
    attempts: int
    outcome: Literal["done", "dead"]
    enqueued_at: int
    started_at: int | None
    processed_at: int
    code_version: str | None
    tape: dict[str, Any] | None
    error: str | None  # a dead-lettered input's last error

    @property
    def kind(self) -> str:
        """What the input was: ``event`` (of a stream, at ``offset``),
        ``message`` (a conversation's), ``schedule`` (a firing) or ``direct``."""
        source = self.event.get("source")
        if isinstance(source, dict) and source.get("schedule") is not None and self.path is None:
            return "schedule"
        if self.event.get("type") == _MESSAGE_EVENT:
            return "message"
        return "event" if self.path is not None else "direct"

    def as_dict(self) -> dict[str, Any]:
        tape = self.tape or {}
        return {
            "seq": self.seq,
            "kind": self.kind,
            "path": self.path,
            "offset": self.offset,
            "event": self.event,
            "attempts": self.attempts,
            "outcome": self.outcome,
            "error": self.error,
            "enqueued_at": self.enqueued_at,
            "started_at": self.started_at,
            "processed_at": self.processed_at,
            "code_version": self.code_version,
            "ops": tape.get("ops", []),
        }


class InputPage(NamedTuple):
    inputs: list[InputRecord]
    next_after: int | None  # the seq to continue after (None: the last page)


class InputStore(Protocol):
    """The kept inputs (``store.inputs``). They are written by the actor
    store's completing transactions (``claim``/``complete``, ``fail`` when
    it buries a row, ``commit_run``); this part reads and prunes them."""

    async def inputs(
        self, tenant: str, instance_id: str, *, after: int = 0, upto: int | None = None, limit: int = 100,
    ) -> InputPage:
        """The instance's inputs with ``after < seq <= upto``, by seq."""
        ...

    async def prune(
        self, tenant: str, actor: str, *, keep: int | None, before_ms: int | None, limit: int,
    ) -> int:
        """Delete up to ``limit`` inputs of ``actor``'s instances beyond the
        newest ``keep`` of each instance, or finished before ``before_ms``
        (but an instance's newest, which the next one is numbered after);
        the number deleted."""
        ...

    async def complete(self, tenant: str, instance_id: str) -> bool:
        """Whether every input the instance ever had was kept (none before
        inputs were kept, none while its actor kept none): a fork replays
        from its creation only then."""
        ...

    async def mark_incomplete(self, tenant: str, actor: str) -> int:
        """``actor`` keeps no inputs: its instances' histories are not complete."""
        ...


def completions(done: Sequence[Completion | tuple[int, int]]) -> list[Completion]:
    """``done`` as Completions (a bare ``(qid, attempts)`` is one too)."""
    return [d if isinstance(d, Completion) else Completion(*d) for d in done]


# The columns of an input, as both drivers read them (input_from_row).
INPUT_COLUMNS = (
    "tenant_id, instance_id, seq, qid, path, stream_seq, event, attempts, outcome, enqueued_at,"
    " started_at, processed_at, code_version, tape, last_error"
)


def input_from_row(row: Sequence[Any]) -> InputRecord:
    return InputRecord(
        tenant=row[0], instance_id=row[1], seq=row[2], qid=row[3], path=row[4], offset=row[5],
        event=_json(row[6]), attempts=row[7], outcome=row[8], enqueued_at=row[9], started_at=row[10],
        processed_at=row[11], code_version=row[12], tape=_json(row[13]), error=row[14],
    )


def _json(value: Any) -> Any:
    return None if value is None else orjson.loads(value)
