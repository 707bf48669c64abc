"""Yoke: durable event streams and actors for Python.

Public API: ``open()``, the ``Runtime`` and ``Stream`` handles, the event
types, actors (``App``, ``Filter``), subscription receivers (``copy_to_stream``,
``call``, ``processor``, ``webhook``) and the error hierarchy.

The errors are imported at once; every other name on first use (PEP 562), so
that ``import yoke.cli`` (every ``yoke`` command) does not pay for the
runtime, the HTTP stack and the database drivers.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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
    PortalCallFailed,
    PortalMethodNotFound,
    PortalNotFound,
    PortalTimeout,
    ReservedEventType,
    RuntimeClosed,
    StreamClosed,
    StreamNotFound,
    SubscriptionNotFound,
    UnknownActor,
    UnknownEventField,
    YokeError,
)

from .build import __version__  # the version lives in build.py

# name -> the module that defines it, imported on first use.
_LAZY = {
    "Settings": ".config",
    "App": ".actors.app",
    "PortalRequest": ".actors.portals",
    "AppendResult": ".events",
    "Event": ".events",
    "Filter": ".routing.filters",
    "Runtime": ".runtime",
    "open": ".runtime",
    "InstanceInfo": ".store.actors",
    "Retention": ".store.contract",
    "StreamInfo": ".store.contract",
    "Stream": ".streams.stream",
    "Subscribed": ".subscriptions.management",
    "SubscriptionStatus": ".subscriptions.management",
    "call": ".subscriptions.receivers",
    "copy_to_stream": ".subscriptions.receivers",
    "processor": ".subscriptions.receivers",
    "webhook": ".subscriptions.receivers",
    "secret_from_env": ".subscriptions.receivers",
    "secret_from_setting": ".subscriptions.receivers",
}

if TYPE_CHECKING:
    from .actors.app import App
    from .actors.portals import PortalRequest
    from .config import Settings
    from .events import AppendResult, Event
    from .routing.filters import Filter
    from .runtime import Runtime, open
    from .store.actors import InstanceInfo
    from .store.contract import Retention, StreamInfo
    from .streams.stream import Stream
    from .subscriptions.management import Subscribed, SubscriptionStatus
    from .subscriptions.receivers import (
        call,
        copy_to_stream,
        processor,
        secret_from_env,
        secret_from_setting,
        webhook,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

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
    "PortalCallFailed",
    "PortalMethodNotFound",
    "PortalNotFound",
    "PortalRequest",
    "PortalTimeout",
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
    "secret_from_env",
    "secret_from_setting",
    "webhook",
]
