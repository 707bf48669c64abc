"""Yoke: durable event streams and actors for Python.

Public API: ``open()``, the ``Runtime`` and ``Stream`` handles, the event
types, actors (``App``, ``Filter``) and the error hierarchy.
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
    InstanceNotFound,
    InvalidCursor,
    InvalidEvent,
    InvalidEventType,
    InvalidFilter,
    InvalidIdempotencyKey,
    InvalidInput,
    InvalidPath,
    InvalidSchedule,
    InvalidTenant,
    ReservedEventType,
    RuntimeClosed,
    StreamClosed,
    StreamNotFound,
    UnknownActor,
    UnknownEventField,
    YokeError,
)
from .actors.app import App
from .actors.portals import PortalRequest
from .events import AppendResult, Event
from .routing.filters import Filter
from .runtime import Runtime, open
from .store.actors import InstanceInfo
from .store.contract import Retention, StreamInfo
from .streams.handle import Stream

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppendResult",
    "CursorGone",
    "EphemeralTooLarge",
    "EphemeralWithIdempotencyKey",
    "Event",
    "EventNotFound",
    "EventTooLarge",
    "Filter",
    "ForgedSource",
    "IdempotencyConflict",
    "InstanceInfo",
    "InstanceNotFound",
    "InvalidCursor",
    "InvalidEvent",
    "InvalidEventType",
    "InvalidFilter",
    "InvalidIdempotencyKey",
    "InvalidInput",
    "InvalidPath",
    "InvalidSchedule",
    "InvalidTenant",
    "PortalRequest",
    "ReservedEventType",
    "Retention",
    "Runtime",
    "RuntimeClosed",
    "Settings",
    "Stream",
    "StreamClosed",
    "StreamInfo",
    "StreamNotFound",
    "UnknownActor",
    "UnknownEventField",
    "YokeError",
    "open",
]
