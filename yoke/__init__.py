"""Yoke: durable event streams and actors for Python.

Public API: ``open()``, the ``Runtime`` and ``Stream`` handles, the event
types and the error hierarchy.
"""

from .config import Settings
from .errors import (
    CursorGone,
    EphemeralTooLarge,
    EphemeralWithIdempotencyKey,
    EventNotFound,
    EventTooLarge,
    ForgedSource,
    IdempotencyConflict,
    InvalidCursor,
    InvalidEvent,
    InvalidEventType,
    InvalidIdempotencyKey,
    InvalidInput,
    InvalidPath,
    InvalidTenant,
    ReservedEventType,
    RuntimeClosed,
    StreamClosed,
    StreamNotFound,
    UnknownEventField,
    YokeError,
)
from .events import AppendResult, Event
from .runtime import Runtime, open
from .store.contract import Retention, StreamInfo
from .streams.handle import Stream

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "CursorGone",
    "EphemeralTooLarge",
    "EphemeralWithIdempotencyKey",
    "Event",
    "EventNotFound",
    "EventTooLarge",
    "ForgedSource",
    "IdempotencyConflict",
    "InvalidCursor",
    "InvalidEvent",
    "InvalidEventType",
    "InvalidIdempotencyKey",
    "InvalidInput",
    "InvalidPath",
    "InvalidTenant",
    "ReservedEventType",
    "Retention",
    "Runtime",
    "RuntimeClosed",
    "Settings",
    "Stream",
    "StreamClosed",
    "StreamInfo",
    "StreamNotFound",
    "UnknownEventField",
    "YokeError",
    "open",
]
