"""Session connections: ``Stream.open_connection`` (replay, then live, for one session).

A connection is a callback for one session (a Python caller, or an HTTP
client on the SSE route): it replays the stream after an offset and then
delivers new events live, with the common filter, or (``events=False``)
sends the stream's state whenever it changes: the reduced subscription
catalogue and the processor states. Nothing about it is stored in the
stream: no subscription is appended, there is no cursor to resume. Its
opening and end are lifecycle facts on ``/`` (yoke.stream.connection_opened
and connection_closed).

Opening a second connection with the same (tenant, path, connection key)
ends the first (``replaced``): at once in the same process, and in any
other through the ``connection_opened`` fact, which each process with open
connections of a tenant follows on ``/`` (the later fact wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .. import errors
from ..clock import SYSTEM, Clock, wall_ms
from ..events import Event, check_offset, check_text
from ..lifecycle import CONNECTION_CLOSED, CONNECTION_OPENED, new_stream_id, stream_fact
from ..routing.filters import Filter
from ..store import OpenStore, ReadPage, Store
from .tail import Followed, follow
from .wakeups import WakeupHub


class ConnectedStream(Followed, Protocol):
    """What a connection asks of its stream's handle (``handle.Stream``)."""

    async def read_page(self, after: int = 0, limit: int = 1000) -> ReadPage: ...

    async def read(self, after: int = 0, limit: int = 1000) -> list[Event]: ...

log = logging.getLogger("yoke.streams.connections")

MAX_KEY_CHARS = 200
OnBatch = Callable[[Any], Awaitable[Any]]
OpenGlobal = Callable[[str], ConnectedStream]  # tenant -> its global stream '/', as the application


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
        raise errors.InvalidInput(f"connection_key is 1-{MAX_KEY_CHARS} characters", field="connection_key")
    return check_text(key, "connection_key", errors.InvalidInput)


class Connection:
    """An open session connection. ``await close()`` (or leaving ``async
    with``) ends it; ``await wait()`` returns why it ended: ``closed``,
    ``replaced`` (another connection took its key), ``disconnected`` (its
    HTTP client went away), ``stream_closed`` (the stream was closed and
    everything delivered), ``stream_deleted``, ``failed`` (``error`` says why: the callback
    raised, the filter failed, the cursor was removed by retention) or
    ``shutdown``."""

    def __init__(self, registry: Connections, stream: ConnectedStream, key: str, after: int, events: bool) -> None:
        self._registry = registry
        self.stream = stream
        self.key = key
        self.id = "conn_" + os.urandom(8).hex()
        self.after = after
        self.events = events
        self.opened_at = 0  # the offset of its connection_opened fact on '/'
        self.reason: str | None = None
        self.error: errors.YokeError | None = None
        self._stop = asyncio.Event()
        self._stop_reason = "closed"
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    async def close(self, reason: str = "closed") -> None:
        """End the connection and wait until its end is recorded."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()
        await self._done.wait()

    async def wait(self) -> str:
        await self._done.wait()
        assert self.reason is not None
        return self.reason

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _end(self, reason: str, error: errors.YokeError | None = None) -> None:
        if self.reason is None:
            self.reason, self.error = reason, error


class Connections:
    """The open connections of one runtime."""

    def __init__(
        self, store: OpenStore, hub: WakeupHub, open_global: OpenGlobal, *, tail_sweep_s: float,
        closed: Callable[[], bool], clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._hub = hub
        self._clock = clock  # stamps the connection facts
        self._open_global = open_global
        self._sweep_s = tail_sweep_s
        self._closed = closed
        self._open: dict[tuple[str, str, str], Connection] = {}
        # Per tenant with open connections: a tail of '/' for the
        # connection_opened facts of other processes.
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._open)

    async def open(
        self,
        stream: ConnectedStream,
        connection_key: str,
        on_batch: OnBatch,
        *,
        replay_after: int | None,
        filter: Filter | Mapping[str, Any] | None,  # noqa: A002
        events: bool,
        include_ephemeral: bool,
    ) -> Connection:
        key = check_key(connection_key)
        if not callable(on_batch) or not (
            inspect.iscoroutinefunction(on_batch) or inspect.iscoroutinefunction(getattr(on_batch, "__call__", None))
        ):
            raise errors.InvalidInput("on_batch must be an async function", field="on_batch")
        if not isinstance(events, bool) or not isinstance(include_ephemeral, bool):
            raise errors.InvalidInput("events and include_ephemeral are true or false", field="events")
        event_filter = None if filter is None else Filter.from_dict(filter)
        if event_filter is not None and (event_filter.key is not None or event_filter.streams is not None):
            raise errors.InvalidFilter("a connection's filter has types and where only", field="filter")
        if replay_after is None:
            after = (await stream.read_page(0, 1)).head  # live from now on
        else:
            check_offset(replay_after, "replay_after")
            await stream.read(after=replay_after, limit=1)  # invalid_cursor / cursor_gone now, not later
            after = replay_after
        ident = (stream.tenant, stream.path, key)
        previous = self._open.get(ident)
        if previous is not None:
            await previous.close("replaced")
        connection = Connection(self, stream, key, after, events)
        self._open[ident] = connection
        try:
            await self._watch(stream.tenant)
            stream_id = await self._stream_id(stream)
            connection.opened_at = await self._fact(
                connection, CONNECTION_OPENED, stream_id, replay_after=replay_after, events=events
            )
        except BaseException:  # not opened (the database away, say): nothing left behind
            if self._open.get(ident) is connection:
                del self._open[ident]
            connection._end("failed")
            connection._done.set()
            raise
        connection._task = asyncio.create_task(
            self._run(connection, on_batch, event_filter, include_ephemeral, stream_id),
            name=f"yoke-connection-{connection.id}",
        )
        return connection

    async def close_all(self) -> None:
        for connection in list(self._open.values()):
            await connection.close("shutdown")
        for task in self._watchers.values():
            task.cancel()
        for task in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watchers.clear()

    async def _watch(self, tenant: str) -> None:
        """Follow the tenant's '/' for connection_opened facts from now on
        (started before this process records its own, so none is missed)."""
        task = self._watchers.get(tenant)
        if task is not None and not task.done():
            return
        head = (await self._open_global(tenant).read_page(0, 1)).head
        self._watchers[tenant] = asyncio.create_task(self._replacements(tenant, head), name=f"yoke-connections-{tenant}")

    async def _replacements(self, tenant: str, after: int) -> None:
        opened = Filter(types=[CONNECTION_OPENED])
        while True:
            try:
                batches = follow(
                    self._open_global(tenant), after, include_ephemeral=False,
                    sweep_s=self._sweep_s, event_filter=opened,
                )
                async for batch in batches:
                    for fact in batch:
                        after = fact.offset
                        p = fact.payload if isinstance(fact.payload, dict) else {}
                        local = self._open.get((tenant, p.get("path"), p.get("connection_key")))
                        if local is not None and local.id != p.get("connection_id") and 0 < local.opened_at < fact.offset:
                            closing = asyncio.ensure_future(local.close("replaced"))
                            self._closing.add(closing)
                            closing.add_done_callback(self._closing.discard)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching (the runtime's end cancels it)
                if self._closed():
                    return
                log.warning("connections of %s: following / failed (%r); again", tenant, exc)
                await asyncio.sleep(self._sweep_s)

    async def _stream_id(self, stream: ConnectedStream) -> str | None:
        info = await self._store().info(stream.tenant, stream.path)
        return None if info is None else info.stream_id

    async def _fact(self, connection: Connection, event_type: str, stream_id: str | None, **extra: Any) -> int:
        stream = connection.stream
        event = stream_fact(
            event_type, stream.path, stream_id, connection_key=connection.key, connection_id=connection.id, **extra
        )
        outcome = await self._store().append_fact(stream.tenant, event, wall_ms(self._clock), new_stream_id())
        self._hub.wake(stream.tenant, "/")
        return outcome.offset

    async def _run(
        self, connection: Connection, on_batch: OnBatch, event_filter: Filter | None, include_ephemeral: bool,
        stream_id: str | None,
    ) -> None:
        try:
            if connection.events:
                ended = await self._events(connection, on_batch, event_filter, include_ephemeral)
            else:
                ended = await self._states(connection, on_batch)
            connection._end(connection._stop_reason if connection._stop.is_set() else ended)
        except errors.StreamDeleted:
            connection._end("stream_deleted")
        except errors.YokeError as exc:  # cursor_gone, filter_failed, runtime_closed
            connection._end("failed", exc)
        except asyncio.CancelledError:
            connection._end("shutdown")
        except Exception as exc:  # the callback raised
            log.info("connection %s on %s: on_batch failed: %r", connection.key, connection.stream.path, exc)
            connection._end("failed", errors.YokeError(f"on_batch raised {type(exc).__name__}: {exc}"))
        finally:
            ident = (connection.stream.tenant, connection.stream.path, connection.key)
            if self._open.get(ident) is connection:
                del self._open[ident]
            extra: dict[str, Any] = {"reason": connection.reason}
            if connection.error is not None:
                extra["error"] = connection.error.to_dict()
            try:
                stream_id = stream_id or await self._stream_id(connection.stream)
                await self._fact(connection, CONNECTION_CLOSED, stream_id, **extra)
            except Exception as exc:  # noqa: BLE001 - a store that went away (shutdown)
                log.warning("connection %s: its close was not recorded: %r", connection.key, exc)
            connection._done.set()

    async def _events(
        self, connection: Connection, on_batch: OnBatch, event_filter: Filter | None, include_ephemeral: bool
    ) -> str:
        stream = connection.stream
        batches = follow(
            stream, connection.after, include_ephemeral=include_ephemeral,
            sweep_s=self._sweep_s, stop=connection._stop, event_filter=event_filter,
        )
        stopping = asyncio.ensure_future(connection._stop.wait())
        try:
            while True:
                step = asyncio.ensure_future(anext(batches))
                await asyncio.wait({step, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    return "closed"
                try:
                    batch: list[Event] = step.result()
                except StopAsyncIteration:
                    return "closed" if connection._stop.is_set() else "stream_closed"
                if batch and not await _deliver(connection, on_batch, batch):
                    return "closed"
        finally:
            stopping.cancel()
            await batches.aclose()

    async def _states(self, connection: Connection, on_batch: OnBatch) -> str:
        stream = connection.stream
        waiter = self._hub.subscribe(stream.tenant, stream.path)
        last: Any = None
        try:
            while not connection._stop.is_set():
                if self._closed():
                    raise errors.RuntimeClosed("the runtime is shutting down")
                state = await stream_state(self._store(), stream.tenant, stream.path)
                if state != last:
                    if not await _deliver(connection, on_batch, state):
                        break
                    last = state
                waits = {asyncio.ensure_future(waiter.wait()), asyncio.ensure_future(connection._stop.wait())}
                try:
                    # Processor checkpoints move without an append: look again every sweep.
                    await asyncio.wait(waits, timeout=self._sweep_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
            return "closed"
        finally:
            waiter.close()


async def _deliver(connection: Connection, on_batch: OnBatch, batch: Any) -> bool:
    """``await on_batch(batch)``, unless the connection is closed meanwhile
    (a callback that waits for a client that went away must not hold the
    close): False then, the call cancelled. The callback's error is raised."""
    call = asyncio.ensure_future(on_batch(batch))
    stopping = asyncio.ensure_future(connection._stop.wait())
    try:
        await asyncio.wait({call, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not call.done():
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        return False
    call.result()
    return True


async def stream_state(store: Store, tenant: str, path: str) -> dict[str, Any]:
    """The stream's reduced state: its subscription catalogue (outbound: the
    subscriptions it is the source of; inbound: the passive-fence records of
    the copies it received, by source path and name) and the state of each
    processor subscription (its checkpoint). Delivery progress is not part
    of it (``subscription(name)`` has that)."""
    subscriptions = store.subscriptions
    outbound: dict[str, Any] = {}
    processors: dict[str, Any] = {}
    for row in await subscriptions.list(tenant, path):
        outbound[row.name] = {
            "configuration": row.config,
            "configured_at_offset": row.configured_at,
            "configured_at": row.configured_ms,
            "cursor_changed_at_offset": row.generation,
            "delivery_halted": row.halted,
        }
        if row.config.get("kind") == "processor":
            cp = await subscriptions.checkpoint(tenant, path, row.name)
            processors[row.name] = None if cp is None else {
                "processor": row.config.get("processor"), "version": cp.version, "stream_id": cp.stream_id,
                "through": cp.through, "state": cp.state, "complete": cp.complete,
            }
    inbound: dict[str, dict[str, Any]] = {}
    for record in await subscriptions.inbound(tenant, path):
        inbound.setdefault(record.source_path, {})[record.name] = {
            "stream_id": record.source_stream_id,
            "stream_created_at": record.source_created_at,
            "cursor_changed_at_source_offset": record.generation,
            "num_events_received": record.received,
            "last_event_received_at": record.last_received_at,
        }
    return {
        "path": path,
        "subscriptions": {"inbound": {"by_source_path": inbound}, "outbound": {"by_name": outbound}},
        "processors": processors,
    }
