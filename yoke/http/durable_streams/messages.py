"""Protocol messages and Yoke events, both ways.

A JSON stream (``application/json``): each message of a POST (a top-level
array is flattened one level) is one event of type ``ds.message`` whose
payload is the message. Any other content type is a byte stream: each POST
body is one event of type ``ds.bytes``, payload null, its bytes in
``Event.data`` (BLOB / BYTEA). Reading back, a ``ds.message`` event is its
payload and a ``ds.bytes`` event its bytes; an event appended through Yoke's
own API (any other type) reads as ``{"type": ..., "payload": ...}`` (in a
byte stream, that object's JSON text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

from ... import errors
from ...events import PreparedEvent, json_text, json_texts, new_event_id, new_event_ids, utf8_len
from ...store.contract import Store, StoredEvent
from ...store.durable_stream_forks import BYTES_TYPE, JSON, base_type, bytes_event
from ..responses import read_json

MESSAGE_TYPE = "ds.message"
# What a message costs besides its JSON (the envelope a read sends with it).
MESSAGE_OVERHEAD = 16
# A read's page: at most this many events, and this many bytes of them
# (the first event whatever its size).
PAGE_EVENTS = 1000
PAGE_BYTES = 1024 * 1024


def is_json(content_type: str) -> bool:
    return base_type(content_type) == JSON


def is_text(content_type: str) -> bool:
    kind = base_type(content_type)
    return kind == JSON or kind.startswith("text/")


class MessageEvent(PreparedEvent):
    """A ``ds.message`` event: only its id, text and size are its own; the
    other fields are the class's, read past the unused slots (building one
    costs half what a whole PreparedEvent does, and a batch of messages
    builds hundreds on the event loop)."""

    __slots__ = ()
    type = MESSAGE_TYPE
    metadata_json = "{}"
    source_json = correlation = group_id = idempotency_key = fingerprint = object_id = data = None
    priority = 0
    ephemeral = False

    def __init__(self, event_id: str, payload_json: str, size: int) -> None:
        self.id = event_id
        self.payload_json = payload_json
        self.size = size


def message_events(payloads_json: Sequence[str], event_ids: Sequence[str]) -> list[PreparedEvent]:
    """The ``ds.message`` events of these JSON texts, each sized as every
    event is (its UTF-8 bytes, and what a read sends with it)."""
    sizes = [utf8_len(text) + MESSAGE_OVERHEAD for text in payloads_json]
    return list(map(MessageEvent, event_ids, payloads_json, sizes))


def message_event(payload_json: str, event_id: str | None = None) -> PreparedEvent:
    return message_events([payload_json], [event_id or new_event_id()])[0]


def events_of(body: bytes, content_type: str, *, creating: bool = False) -> list[PreparedEvent]:
    """The events a POST (or PUT) body appends to a stream of ``content_type``."""
    if not is_json(content_type):
        return [bytes_event(body)] if body else []
    value, finite = read_json(body)  # integers beyond 64 bits exactly, to refuse them below
    if not isinstance(value, list):
        return [message_event(json_text(value, "message"))]
    if not value and not creating:
        raise errors.InvalidEvent("an empty JSON array appends nothing")
    texts = json_texts(value, "message", finite=finite)
    return message_events(texts, new_event_ids(len(texts)))


def _message_json(event: StoredEvent) -> str:
    if event.type == MESSAGE_TYPE:
        return event.payload_json  # the canonical text the append stored
    if event.data is not None:  # bytes in a JSON stream (a fork of another type cannot happen)
        return orjson.dumps(event.data.decode("utf-8", "replace")).decode()
    return '{"type":' + orjson.dumps(event.type).decode() + ',"payload":' + event.payload_json + "}"


def _message_bytes(event: StoredEvent) -> bytes:
    if event.data is not None:
        return event.data
    return _message_json(event).encode()


def render(events: Sequence[StoredEvent], content_type: str) -> bytes:
    """A read's body from ``Store.read_stored``'s events, the stored JSON texts
    as they are (never decoded and encoded again): a JSON array of the
    messages, or the bytes concatenated."""
    if is_json(content_type):
        return ("[" + ",".join([_message_json(e) for e in events]) + "]").encode()
    return b"".join([_message_bytes(e) for e in events])


class Page(NamedTuple):
    """A protocol read's page: whether the stream exists, its head and closed
    flag read with the page, the page's last offset (None: no message after
    the read's offset), and the response body (``render``'s)."""

    exists: bool
    head: int
    closed: bool
    last: int | None
    body: bytes


async def read_page(store: Store, tenant: str, path: str, after: int, content_type: str) -> Page:
    """The messages after offset ``after``. A page of a JSON stream holding
    only ``ds.message`` events comes joined by the database, as it is
    stored; any other page is read event by event and rendered."""
    if is_json(content_type):
        joined = await store.read_payloads(tenant, path, after, PAGE_EVENTS, PAGE_BYTES, MESSAGE_TYPE)
        if joined is not None:
            return Page(True, joined.head, joined.closed, joined.last, joined.body)
    page = await store.read_stored(tenant, path, after, PAGE_EVENTS, PAGE_BYTES)
    last = page.events[-1].offset if page.events else None
    return Page(page.exists, page.head, page.closed, last, render(page.events, content_type))


__all__ = ["BYTES_TYPE", "MESSAGE_TYPE", "Page", "events_of", "read_page", "render", "is_json", "is_text"]
