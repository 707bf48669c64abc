"""A TCP proxy in front of PostgreSQL that can end every connection the way
the server does on ``pg_terminate_backend``, with a chosen delay between
the FATAL message and the end of the stream.

The server sends ``FATAL 57P01`` and closes the socket at once, so the gap
in which a client has read the message but not yet the end of the stream
lasts an event-loop turn or two and a test can only hit it by luck. Here the
proxy sends the same message to the client, closes the server side (the
backend ends), and closes the client side ``close_after_s`` later: every
idle pooled connection sits in that state for as long as the test needs.
Bytes are forwarded unchanged otherwise; nothing else is simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass, field


def fatal_admin_shutdown() -> bytes:
    """The ErrorResponse PostgreSQL sends when an administrator ends a session."""
    fields = b"".join(
        code + value.encode() + b"\0"
        for code, value in (
            (b"S", "FATAL"),
            (b"V", "FATAL"),
            (b"C", "57P01"),
            (b"M", "terminating connection due to administrator command"),
        )
    ) + b"\0"
    return b"E" + struct.pack("!i", len(fields) + 4) + fields


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    cut: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class PgProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._pairs: set[_Pair] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            for task in pair.tasks:
                task.cancel()
            pair.client.close()
            pair.server.close()
        self._pairs.clear()

    @property
    def connections(self) -> int:
        return len(self._pairs)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        pair = _Pair(client_w, server_w)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pipe(pair, client_r, server_w)),
            asyncio.create_task(self._pipe(pair, server_r, client_w)),
        ]

    async def _pipe(self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not pair.cut:
                data = await reader.read(65536)
                if not data or pair.cut:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if not pair.cut:
                pair.client.close()
                pair.server.close()
                self._pairs.discard(pair)

    def terminate_all(self, close_after_s: float) -> int:
        """End every connection as ``pg_terminate_backend`` does, the client
        seeing the end of the stream ``close_after_s`` after the FATAL.
        Returns how many connections were ended."""
        pairs = list(self._pairs)
        loop = asyncio.get_running_loop()
        for pair in pairs:
            pair.cut = True
            self._pairs.discard(pair)
            for task in pair.tasks:
                task.cancel()
            pair.server.close()
            with contextlib.suppress(OSError):
                pair.client.write(fatal_admin_shutdown())
            loop.call_later(close_after_s, pair.client.close)
        return len(pairs)
