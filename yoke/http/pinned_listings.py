"""Streams that pin data handling, in the generic listings.

Which operation a caller may do to a stream is decided by the stream itself
(``streams/rules.py``): the generic routes open streams for a generic caller,
which a stream that pins data handling refuses (403 ``data_handling_pinned``).
What is left here is for routes that show or act on events of many streams at
once (the failures inbox, an instance's queue): they leave a pinned stream's
events out, and refuse to append a corrected one to it.
"""

from __future__ import annotations

from ..runtime import Runtime
from ..streams.rules import APPEND, READ, Caller


async def pins_data_handling(runtime: Runtime, tenant: str, path: str) -> bool:
    """Whether the stream at ``path`` pins its data handling (only workflow streams can)."""
    return (await runtime.stream(path, tenant=tenant).admission(READ)).pins is not None


async def refuse_pinned(runtime: Runtime, tenant: str, path: str) -> None:
    """A generic route appending to the stream at ``path``: 403 if it pins data handling."""
    await runtime.stream(path, tenant=tenant, caller=Caller.generic()).admission(APPEND)


class PinnedPaths:
    """Which streams pin data handling, each looked up once: for listings
    that show events from many streams (failures, actor queues), which
    leave a pinned stream's events out."""

    def __init__(self, runtime: Runtime, tenant: str) -> None:
        self._runtime, self._tenant = runtime, tenant
        self._known: dict[str, bool] = {}

    async def pinned(self, path: str | None) -> bool:
        if path is None:
            return False
        if path not in self._known:
            self._known[path] = await pins_data_handling(self._runtime, self._tenant, path)
        return self._known[path]
