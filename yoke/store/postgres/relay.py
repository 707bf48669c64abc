"""Ephemeral events between processes: the NOTIFY wire format.

An ephemeral event is never written. On PostgreSQL its body travels to
every other process in NOTIFY payloads on the relay channel (migration
0008: a secret name, since PostgreSQL checks no privilege for LISTEN or
NOTIFY), sent by ``yoke_append_relay`` inside the append's transaction: so
they are delivered at commit, in commit order, and never for a refused or
rolled-back append.

A payload is at most 8000 bytes, an event up to ``max_event_bytes``
(64 KiB by default), so each event is one message cut into chunks::

    <offset>:<key>:<index>:<count>:<piece>

``<offset>`` is prepended by SQL (the offset is only known there); ``key``
is unique per message in the sending process; the pieces, joined, are the
message: a JSON header line (tenant, path, time, the event's small fields
and the lengths of its three JSON texts), then those texts verbatim, so
values come out exactly as they went in.

Barrier pings share the channel: ``b:<token>``.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Sequence

import orjson

from ...events import PreparedEvent

# NOTIFY refuses payloads of 8000 bytes or more: a piece leaves room for the
# offset (at most 19 digits), the key, index and count, and the separators.
PIECE_BYTES = 7900
# Messages being reassembled (their chunks arrive back to back, one
# transaction's notifications are never interleaved with another's; a
# reconnect can cut one short): at most this many are kept.
MAX_PARTIAL = 64

_keys = itertools.count()
_PREFIX = os.urandom(4).hex()


def encode(tenant: str, path: str, at: int, events: Sequence[PreparedEvent]) -> tuple[list[int], list[str]]:
    """The chunks of the ephemeral ``events`` of one commit: (the 1-based
    index of the event each chunk belongs to, the chunks)."""
    owners: list[int] = []
    chunks: list[str] = []
    for index, e in enumerate(events, 1):
        if not e.ephemeral:
            continue
        source = e.source_json or ""
        header = orjson.dumps([
            tenant, path, at, e.id, e.type, e.correlation, e.priority, e.group_id, e.size,
            len(e.payload_json), len(e.metadata_json), len(source) if e.source_json else -1,
        ]).decode()
        message = (header + "\n" + e.payload_json + e.metadata_json + source).encode()
        pieces = _cut(message)
        key = f"{_PREFIX}{next(_keys):x}"
        for i, piece in enumerate(pieces):
            owners.append(index)
            chunks.append(f"{key}:{i}:{len(pieces)}:{piece}")
    return owners, chunks


def _cut(message: bytes) -> list[str]:
    """``message`` in pieces of at most ``PIECE_BYTES``, never inside a
    UTF-8 sequence (a payload is text)."""
    pieces: list[str] = []
    start = 0
    while start < len(message):
        end = min(start + PIECE_BYTES, len(message))
        while end < len(message) and message[end] & 0xC0 == 0x80:  # a continuation byte
            end -= 1
        pieces.append(message[start:end].decode())
        start = end
    return pieces or [""]


class Reassembly:
    """Chunks in, whole events out."""

    def __init__(self) -> None:
        self._partial: OrderedDict[str, list[str]] = OrderedDict()

    def clear(self) -> None:
        self._partial.clear()

    def add(self, payload: str) -> tuple[str, str, int, int, PreparedEvent] | None:
        """(tenant, path, offset, at, event) once a message is complete."""
        offset, key, index, count, piece = payload.split(":", 4)
        n = int(count)
        if n == 1:
            return _decode(int(offset), piece)
        parts = self._partial.get(key)
        if parts is None:
            if index != "0":
                return None  # its start was lost (a reconnect)
            parts = self._partial[key] = []
            while len(self._partial) > MAX_PARTIAL:
                self._partial.popitem(last=False)
        if int(index) != len(parts):
            del self._partial[key]
            return None
        parts.append(piece)
        if len(parts) < n:
            return None
        del self._partial[key]
        return _decode(int(offset), "".join(parts))


def _decode(offset: int, message: str) -> tuple[str, str, int, int, PreparedEvent]:
    line, _, texts = message.partition("\n")
    (tenant, path, at, event_id, type_, correlation, priority, group_id, size,
     n_payload, n_metadata, n_source) = orjson.loads(line)
    payload = texts[:n_payload]
    metadata = texts[n_payload : n_payload + n_metadata]
    source = texts[n_payload + n_metadata :] if n_source >= 0 else None
    event = PreparedEvent(
        id=event_id, type=type_, payload_json=payload, metadata_json=metadata, source_json=source,
        correlation=correlation, priority=priority, group_id=group_id, idempotency_key=None,
        ephemeral=True, fingerprint=None, size=size,
    )
    return tenant, path, offset, at, event
