"""Yoke: durable event streams and actors for Python.

Public API: ``open()``, the ``Runtime`` and ``Stream`` handles, the event
types, actors (``App``, ``Filter``), subscription receivers (``copy_to_stream``,
``call``, ``processor``, ``webhook``) and the error hierarchy.
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
    InvalidSubscription,
    InvalidTransform,
    NotProcessed,
    InvalidTenant,
    ReservedEventType,
    RuntimeClosed,
    StreamClosed,
    StreamNotFound,
    SubscriptionNotFound,
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
from .subscriptions.operator import Subscribed, SubscriptionStatus
from .subscriptions.receivers import call, copy_to_stream, processor, webhook

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
    "InvalidSubscription",
    "InvalidTransform",
    "NotProcessed",
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
    "Subscribed",
    "SubscriptionNotFound",
    "SubscriptionStatus",
    "UnknownActor",
    "UnknownEventField",
    "YokeError",
    "call",
    "copy_to_stream",
    "open",
    "processor",
    "webhook",
]
