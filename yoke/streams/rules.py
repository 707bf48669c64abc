"""Who may do what to a stream: the one place a stream's rules meet its caller.

Every surface reaches a stream through a handle opened for a ``Caller``
(``Stream(..., caller=...)``, ``ProtocolStreams``), and every operation of
the handle asks ``admit`` before it touches the store. So ``/v1/streams``,
``/v1/stream``, ``/api/workflow-streams``, the console and the CLI (clients of
``/v1``), SSE, long-poll, HEAD, forks, copies and the Python API all get the
same answer from one function, and a surface added later cannot forget a
rule: it cannot open a stream without saying who is asking.

The rules a stream carries, and where each is decided:

- data handling pins (``pins.py``: authorization, redaction, client egress,
  content classes, input direction): here, for every operation;
- legal hold: the store, in the transaction that would delete the stream
  (``LegalHold``; a protocol stream's soft deletion too); a held stream
  never expires;
- closed: the store, in the append's transaction (``StreamClosed``);
- retention: the store's read (``CursorGone``) and the pruning loop, which
  a legal hold stops.

Three kinds of caller:

- ``APPLICATION``: the application itself (the Python API, actors, timers,
  the kernel's own appends). Who-is-asking rules (authorization, redaction,
  egress) do not apply to it: it owns the database. What-may-be-stored rules
  do: content classes, and input records go with their delivery outbox.
- ``WORKFLOW``: the workflow surface, which carries pins: each is checked
  against the token's scopes and id and the client's declared region, and
  reads are masked where the token lifts no redaction.
- ``GENERIC``: surfaces that cannot express pins (``/v1/streams``,
  ``/v1/stream``: a protocol reader cannot lift a redaction nor declare a
  content class). A stream that pins data handling is refused there, every
  operation, with 403 ``data_handling_pinned``.

Only workflow streams (paths under ``/runs/``) may pin data handling, so any
other path is admitted without a lookup.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .. import errors
from ..events import Event, PreparedEvent
from .data_handling import DataHandling, Redactor, check_not_forbidden

WORKFLOW_PREFIX = "/runs/"


class Surface(enum.Enum):
    APPLICATION = "application"
    WORKFLOW = "workflow"
    GENERIC = "generic"


# What an operation does to a stream. Reads include tails, HEAD, acks,
# consumers and a fork's copy of its source; appends include objects;
# "configure" covers settings, close, subscriptions and (re)creation;
# "delete" a stream's deletion.
READ, APPEND, CONFIGURE, DELETE = "read", "append", "configure", "delete"
ACTIONS = (READ, APPEND, CONFIGURE, DELETE)


@dataclass(frozen=True)
class Caller:
    """Who is asking, and through which kind of surface."""

    surface: Surface
    scopes: tuple[str, ...] = ()
    subject: str | None = None  # the token's id
    region: str | None = None  # the client region the request declares (Client-Region)

    @classmethod
    def generic(cls, scopes: Iterable[str] = (), subject: str | None = None) -> Caller:
        return cls(Surface.GENERIC, tuple(scopes), subject)

    @classmethod
    def workflow(cls, scopes: Iterable[str], subject: str | None, region: str | None) -> Caller:
        return cls(Surface.WORKFLOW, tuple(scopes), subject, region)


APPLICATION = Caller(Surface.APPLICATION)


def may_pin(path: str) -> bool:
    """Whether a stream at ``path`` can pin data handling (only workflow streams)."""
    return path.startswith(WORKFLOW_PREFIX)


@dataclass(frozen=True)
class Admission:
    """What an admitted operation must still honour: the stream's pins (None:
    it pins nothing) and, for a read, what the caller may not see."""

    path: str
    caller: Caller
    pins: DataHandling | None = None
    redactor: Redactor | None = None

    @property
    def view(self) -> tuple[str, ...]:
        """Which masks this caller's reads carry (a cache key: () is the whole record)."""
        return () if self.redactor is None else self.redactor.key

    @property
    def input_wake(self) -> str | None:
        """For an input stream, the run stream its records' wake events go to."""
        if self.pins is None or self.pins.direction != "input":
            return None
        return self.path.rsplit("/", 1)[0]

    def mask(self, events: list[Event]) -> list[Event]:
        """``events`` as this caller may see them."""
        redactor = self.redactor
        return events if redactor is None else [redactor.apply_event(e) for e in events]

    def check_prepared(self, events: Iterable[PreparedEvent], what: str) -> None:
        """``check_records`` for events the kernel prepared (copies, an atomic
        run's appends), which cannot go through an input stream's outbox."""
        if self.input_wake is not None:
            raise errors.DataHandlingPinned(
                f"stream {self.path} takes input records, which go with their delivery outbox: "
                f"{what} cannot append to it", path=self.path,
            )
        if self.pins is not None or may_pin(self.path):
            self.check_records([{"metadata": orjson.loads(e.metadata_json)} for e in events])

    def check_records(self, records: Iterable[Any]) -> None:
        """Each record's declared content class (``metadata.content_class``):
        the pinned set, and never raw hidden model reasoning on a workflow
        stream. ``records`` are event mappings (non-mappings are left to
        the append's own validation)."""
        if self.pins is None and not may_pin(self.path):
            return
        for record in records:
            metadata = record.get("metadata") if isinstance(record, Mapping) else None
            declared = metadata.get("content_class") if isinstance(metadata, Mapping) else None
            if self.pins is not None:
                self.pins.check_class(declared)
            else:
                check_not_forbidden(declared)


def admit(path: str, pins: DataHandling | None, caller: Caller, action: str) -> Admission:
    """``caller`` may do ``action`` to the stream at ``path`` pinning ``pins``
    (None: it pins nothing); what it must still honour. Raises the refusal."""
    if pins is None:
        return Admission(path, caller)
    if caller.surface is Surface.GENERIC:
        raise errors.DataHandlingPinned(
            f"stream {path} pins its data handling: use /api/workflow-streams", path=path
        )
    if caller.surface is Surface.APPLICATION:
        return Admission(path, caller, pins)
    pins.check_egress(caller.region)
    if action in (READ, APPEND):
        pins.check_access(action, caller.scopes, caller.subject or "")
    redactor = pins.redactor(caller.scopes) if action == READ else None
    return Admission(path, caller, pins, redactor)
