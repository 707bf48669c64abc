"""Streams the protocol's appends remember between requests.

A POST needs its stream's content type (to read the body) and whether it is
open: looking that up is a read per request, a tenth of the server's CPU in
batch appends. A remembered stream is only a hint. The append carries the
lifetime it was decided for (``Guard.stream_id``), and the store refuses it
as ``gone`` when the path now holds another lifetime or a soft-deleted
stream, whichever process changed it; the route then forgets the stream and
looks again. Streams with a TTL or an expiry time are never remembered
(every request touches or checks them), nor closed or deleted ones.
"""

from __future__ import annotations

from ...store.durable_streams import ProtocolStream

CAPACITY = 10_000


class KnownStreams:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._streams: dict[tuple[str, str], ProtocolStream] = {}

    def get(self, tenant: str, path: str) -> ProtocolStream | None:
        return self._streams.get((tenant, path))

    def remember(self, tenant: str, stream: ProtocolStream) -> None:
        if stream.closed or stream.deleted or stream.ttl_s is not None or stream.expires_ms is not None:
            self.forget(tenant, stream.path)
            return
        if len(self._streams) >= self._capacity:
            del self._streams[next(iter(self._streams))]  # the oldest remembered
        self._streams[(tenant, stream.path)] = stream

    def forget(self, tenant: str, path: str) -> None:
        self._streams.pop((tenant, path), None)
