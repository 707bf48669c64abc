"""Lifecycle facts: kernel events on the tenant's global stream ``/``.

An instance created, adopted by another worker or removed, and a stream
created, closed or deleted, or a session connection to it opened or closed,
each appends one ``yoke.instance.*`` or ``yoke.stream.*`` event to ``/``, the
tenant's sequencing authority, in the transaction that makes the change
(connections: when they open and close). A stream's own offsets stay its
producers' (its first event is still offset 1).

These facts are local: copy subscriptions never deliver them (a reciprocal
pair of copies cannot manufacture them forever), and an actor filter's
``*`` does not match them (an actor that creates an instance per event would
otherwise feed itself); a filter that names them (``yoke.instance.created``,
``yoke.stream.*``) gets them.
"""

from __future__ import annotations

from typing import Any

from .events import PreparedEvent, prepare, random_bits

GLOBAL = "/"

INSTANCE_CREATED = "yoke.instance.created"
INSTANCE_ADOPTED = "yoke.instance.adopted"
INSTANCE_REMOVED = "yoke.instance.removed"
STREAM_CREATED = "yoke.stream.created"
STREAM_CLOSED = "yoke.stream.closed"
STREAM_DELETED = "yoke.stream.deleted"
CONNECTION_OPENED = "yoke.stream.connection_opened"
CONNECTION_CLOSED = "yoke.stream.connection_closed"

# yoke.failure.*: the failures inbox's audit events (failures/model.py), on the
# stream each failure concerns; local like the facts above.
PREFIXES = ("yoke.instance.", "yoke.stream.", "yoke.failure.")


def new_stream_id() -> str:
    """A stream's random lifetime id. Every commit makes one (a commit may
    create its stream): unique, not secret, so the fast PRNG event ids use
    rather than a system call each."""
    return f"str_{random_bits(96):024x}"


def is_lifecycle(event_type: str) -> bool:
    return event_type.startswith(PREFIXES)


def fact(event_type: str, payload: dict[str, Any]) -> PreparedEvent:
    return prepare({"type": event_type, "payload": payload}, trusted=True)


def instance_fact(event_type: str, instance: Any, **extra: Any) -> PreparedEvent:
    """``instance``: an InstanceInfo (or a row with the same attributes)."""
    return fact(event_type, {
        "instance_id": instance.instance_id, "actor": instance.actor, "key": instance.key,
        "parent_id": instance.parent_id, "worker_id": instance.worker_id, **extra,
    })


def stream_fact(event_type: str, path: str, stream_id: str, **extra: Any) -> PreparedEvent:
    return fact(event_type, {"path": path, "stream_id": stream_id, **extra})
