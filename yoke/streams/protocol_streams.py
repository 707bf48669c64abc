"""Durable Streams protocol streams (``/v1/stream/{name}``) as a caller may use them.

The protocol's own rules live here, not in its HTTP routes: a stream's TTL or
expiry time (an expired stream is deleted when found), deletion while forks
of it live (the stream is only marked deleted; the last fork's deletion
removes it, and so on up the chain), and forks as reads of their source.
Every method first asks the stream's rules (``rules.py``) with the caller's
action, so the protocol gets the answers every other surface gets: a stream
that pins data handling is refused (a protocol reader can neither lift a
redaction nor declare a content class), and a legal hold is absolute: a held
stream is never deleted, marked deleted or expired, forks or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import errors
from ..clock import SYSTEM, Clock, wall_ms
from ..lifecycle import GLOBAL
from ..store.durable_streams import CreateSpec, ProtocolStore, ProtocolStream
from .append import new_stream_id
from .rules import CONFIGURE, DELETE, READ, Caller
from .wakeups import WakeupHub

if TYPE_CHECKING:
    from .stream import Stream

OpenStream = Callable[..., "Stream"]  # (path, tenant=, caller=) -> Stream


class ProtocolStreams:
    def __init__(
        self, protocol: Callable[[], ProtocolStore], hub: WakeupHub, open_stream: OpenStream,
        clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock  # creation, touches (TTL), expiry, deletion
        # ``protocol`` is asked each time: it raises RuntimeClosed once the
        # runtime is closed, as every use of the store must.
        self._protocol = protocol
        self._hub = hub
        self._open = open_stream

    async def lookup(
        self, tenant: str, path: str, caller: Caller, action: str, *, touch: bool = True
    ) -> ProtocolStream:
        """The stream, once ``caller`` may do ``action`` to it: 404 when missing
        (or expired: then it is deleted), 410 when marked deleted. ``touch``:
        a read or write restarts its TTL window."""
        await self._open(path, tenant=tenant, caller=caller).admission(action)
        stream = await self._protocol().stream(tenant, path)
        now = wall_ms(self._clock)
        if stream is not None and not stream.deleted and stream.expired(now):
            stream = await self._expire(tenant, stream)
        if stream is None:
            raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
        if stream.deleted:
            raise errors.StreamDeleted(f"stream {path} was deleted", path=path)
        if touch:
            await self.touch(tenant, stream)
        return stream

    async def touch(self, tenant: str, stream: ProtocolStream) -> None:
        """A read or write of ``stream`` just ended: its TTL window (if it has
        one) starts again now."""
        if stream.ttl_s is not None:
            await self._protocol().touch(tenant, stream.sid, wall_ms(self._clock))

    async def existing(self, tenant: str, path: str, caller: Caller) -> ProtocolStream | None:
        """What a create (PUT) finds at ``path``: the stream (marked deleted or
        not), None when there is none or it expired."""
        await self._open(path, tenant=tenant, caller=caller).admission(CONFIGURE)
        stream = await self._protocol().stream(tenant, path)
        if stream is not None and not stream.deleted and stream.expired(wall_ms(self._clock)):
            stream = await self._expire(tenant, stream)
        return stream

    async def fork_source(self, tenant: str, path: str, caller: Caller) -> ProtocolStream | None:
        """The stream a fork would copy (a fork reads its source)."""
        await self._open(path, tenant=tenant, caller=caller).admission(READ)
        return await self._protocol().stream(tenant, path)

    async def create(
        self, tenant: str, path: str, caller: Caller, spec: CreateSpec
    ) -> tuple[ProtocolStream, bool]:
        """``ProtocolStore.create``: the stream at ``path`` (False) or a new one
        (True), a fork's records copied from its source."""
        await self._open(path, tenant=tenant, caller=caller).admission(CONFIGURE)
        if spec.fork_of is not None:
            await self._open(spec.fork_of, tenant=tenant, caller=caller).admission(READ)
        stream, created = await self._protocol().create(tenant, path, new_stream_id(), wall_ms(self._clock), spec)
        if created and (spec.events or stream.head):
            self._hub.wake(tenant, path)
        if created:
            self._hub.wake(tenant, GLOBAL)  # its yoke.stream.created fact
        return stream, created

    async def delete(self, tenant: str, path: str, caller: Caller) -> list[str]:
        """Delete the stream (``Stream.delete``), or only mark it deleted while
        forks of it live; a legal hold refuses both (409 ``legal_hold``). The
        paths deleted or marked, for callers that remember streams."""
        stream = await self.lookup(tenant, path, caller, DELETE, touch=False)
        return await self._delete(tenant, stream)

    async def _expire(self, tenant: str, stream: ProtocolStream) -> ProtocolStream | None:
        """An expired stream is deleted when found (marked deleted while forks
        of it live): what is left of it. A held stream does not expire."""
        try:
            await self._delete(tenant, stream)
        except errors.LegalHold:
            return stream
        return await self._protocol().stream(tenant, stream.path)

    async def _delete(self, tenant: str, stream: ProtocolStream) -> list[str]:
        """Delete ``stream``; a fork's deletion then deletes its marked source
        once no fork of that is left, and so on up the chain, stopping at a
        source put on hold after it was marked."""
        protocol = self._protocol()
        done: list[str] = []
        current: ProtocolStream | None = stream
        while current is not None:
            if await protocol.forks(tenant, current.path):
                await protocol.soft_delete(tenant, current.sid, wall_ms(self._clock))  # LegalHold while held
                self._hub.wake(tenant, current.path)
                return [*done, current.path]
            try:
                await self._open(current.path, tenant=tenant).delete()
            except errors.StreamNotFound:
                return done  # deleted meanwhile
            except errors.LegalHold:
                if done:  # a marked source held since: it stays, marked
                    return done
                raise
            done.append(current.path)
            source = None if current.fork_of is None else await protocol.stream(tenant, current.fork_of)
            current = source if source is not None and source.deleted else None
        return done
