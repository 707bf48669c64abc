"""``Stream``: the handle for one stream, ``runtime.stream(path, tenant=...)``."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from .. import errors
from ..events import (
    AppendResult,
    Event,
    check_offset,
    json_text,
    prepare,
    validate_path,
    validate_tenant,
)
from ..routing.filters import Filter
from ..store.contract import MAX_GAPS, ConsumerInfo, GapEvidence, Limits, ReadPage, Retention, StreamInfo, StreamSettings
from ..lifecycle import GLOBAL
from .append import first_refusal, new_stream_id, refusal_error
from ..subscriptions.management import HISTORY_SCAN, History, Subscribed, Subscriptions, SubscriptionStatus
from ..subscriptions.receivers import Receiver, copy_to_stream
from .connections import Connection
from .objects import StreamObjects
from .data_handling import DataHandling
from .receipts import receipt
from .rules import APPEND, APPLICATION, CONFIGURE, DELETE, READ, Admission, Caller, admit, may_pin
from .tail import tail

if TYPE_CHECKING:
    from .kernel import StreamKernel

MAX_READ_LIMIT = 10_000
MAX_BATCH_EVENTS = 10_000


MAX_COUNT = 2**62  # ceilings and counts stay well inside int64
MAX_AGE_S = 100 * 365 * 24 * 3600


def _check_count(value: Any, name: str) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT
    ):
        raise errors.InvalidInput(f"{name} must be a positive integer up to 2^62", field=name)


def _check_retention(max_age_s: float | None, max_events: int | None) -> Retention:
    if max_age_s is not None and (
        isinstance(max_age_s, bool)
        or not isinstance(max_age_s, (int, float))
        or not 0 < max_age_s <= MAX_AGE_S  # also rejects nan and inf
    ):
        raise errors.InvalidInput("max_age_s must be a positive number of seconds up to 100 years", field="max_age_s")
    _check_count(max_events, "max_events")
    return Retention(
        max_age_s=float(max_age_s) if max_age_s is not None else None, max_events=max_events
    )


class Stream:
    """One stream of one tenant, as ``caller`` may use it: every operation is
    admitted by ``rules.admit`` first (``APPLICATION``, the default, is the
    application itself; the HTTP surfaces open handles for their tokens)."""

    def __init__(
        self, kernel: StreamKernel, path: str, tenant: str = "default", *, caller: Caller = APPLICATION
    ) -> None:
        self.kernel = kernel
        self.tenant = validate_tenant(tenant)
        self.path = validate_path(path)
        self.caller = caller
        self.objects = StreamObjects(self)
        self._read_admission: Admission | None = None

    def __repr__(self) -> str:
        return f"<Stream {self.tenant}:{self.path}>"

    def at(self, path: str) -> Stream:
        """Another stream of this tenant, for the same caller."""
        return Stream(self.kernel, path, self.tenant, caller=self.caller)

    # --- rules -------------------------------------------------------------------

    async def admission(self, action: str) -> Admission:
        """What this handle's caller may do (``rules.admit``): the refusal
        raised, or what the operation must still honour. Only workflow
        streams can pin data handling: other paths cost no lookup."""
        pins = None
        if may_pin(self.path):
            info = await self.kernel.store().info(self.tenant, self.path)
            pins = None if info is None else DataHandling.from_stored(info.data_handling)
        admission = admit(self.path, pins, self.caller, action)
        if action == READ:
            self._read_admission = admission
        return admission

    @property
    def view(self) -> tuple[str, ...]:
        """Which masks this handle's reads carried (``Admission.view``; () before
        any read): what a cache of rendered events must key on."""
        return () if self._read_admission is None else self._read_admission.view


    # --- append --------------------------------------------------------------

    async def append(self, event: Mapping[str, Any]) -> AppendResult:
        """Append one event; returns after the durable commit."""
        return (await self.append_many([event]))[0]

    async def append_many(self, events: Iterable[Mapping[str, Any]]) -> list[AppendResult]:
        """Append a batch atomically: all events get consecutive offsets, or none is written.
        On an input stream (a workflow definition with ``direction: input``)
        the records go with their delivery outbox, as ``append_input`` to
        the run's stream."""
        return await self._append(events, trusted=False)

    async def append_input(self, events: Iterable[Mapping[str, Any]], *, wake: str) -> list[AppendResult]:
        """Append input records (a batch, atomically) and, in the same
        transaction, their delivery outbox: each new record's wake event
        (``yoke.input.received``, with an id and idempotency key derived
        from the record) is then published on the stream ``wake`` exactly
        once, even if this process dies before publishing it
        (``streams/inputs.py``). Input records cannot be ephemeral."""
        validate_path(wake)
        if isinstance(events, (str, bytes, Mapping)):
            raise errors.InvalidInput("append_input takes a list of events", field="events")
        events = list(events)
        (await self.admission(APPEND)).check_records(events)
        return await self._append_input(events, wake)

    async def _append_input(self, events: list[Mapping[str, Any]], wake: str) -> list[AppendResult]:
        limit = self.kernel.max_event_bytes
        prepared = [prepare(e, max_event_bytes=limit) for e in events]
        if not prepared:
            return []
        if len(prepared) > MAX_BATCH_EVENTS:
            raise errors.InvalidInput(
                f"a batch holds at most {MAX_BATCH_EVENTS} events", field="events", limit=MAX_BATCH_EVENTS
            )
        if any(e.ephemeral for e in prepared):
            raise errors.InvalidInput("input records are durable: no ephemeral", field="ephemeral")
        keys = [e.idempotency_key for e in prepared if e.idempotency_key is not None]
        if len(keys) != len(set(keys)):
            raise errors.InvalidIdempotencyKey("an idempotency key appears twice in one batch")
        tracing = self.kernel.appends.tracing
        sending = tracing.sending(self.tenant, self.path, prepared, operation="append_input") if tracing.on \
            else contextlib.nullcontext()
        with sending:
            result = await self.kernel.store().outbox.append_input(
                self.tenant, self.path, prepared, self.kernel.now_ms(), new_stream_id(), wake
            )
        refusal = first_refusal(result.outcomes)
        if refusal is not None:
            raise refusal_error(refusal, self.path, prepared)
        self.kernel.hub.wake(self.tenant, self.path)
        self.kernel.inputs.kick()
        return [AppendResult(o.offset, o.id, o.at, o.status == "duplicate") for o in result.outcomes]  # type: ignore[arg-type]

    async def _append(
        self, events: Iterable[Mapping[str, Any]], *, trusted: bool, kernel_key: bool = False
    ) -> list[AppendResult]:
        limit = self.kernel.max_event_bytes
        if isinstance(events, (str, bytes, Mapping)):
            raise errors.InvalidInput("append_many takes a list of events", field="events")
        if may_pin(self.path):
            events = list(events)
            admission = await self.admission(APPEND)
            admission.check_records(events)
            if admission.input_wake is not None:
                return await self._append_input(events, admission.input_wake)
        prepared = [
            prepare(e, trusted=trusted, kernel_key=kernel_key, max_event_bytes=limit) for e in events
        ]
        if len(prepared) > MAX_BATCH_EVENTS:
            raise errors.InvalidInput(
                f"a batch holds at most {MAX_BATCH_EVENTS} events", field="events", limit=MAX_BATCH_EVENTS
            )
        return await self.kernel.appends.append(self.tenant, self.path, prepared)

    # --- read ------------------------------------------------------------------

    def _check_cursor(self, page: ReadPage, after: int) -> None:
        if after > page.head:
            raise errors.InvalidCursor(
                f"cursor {after} is beyond the head {page.head}", requested=after, latest=page.head
            )
        if after < page.pruned_through:
            raise errors.CursorGone(
                f"events after {after} were removed by retention",
                requested=after,
                earliest=page.pruned_through + 1,
                latest=page.head,
                reason="retention",
            )

    async def read(
        self, after: int = 0, limit: int = 1000, *, include_ephemeral: bool = False,
        max_bytes: int | None = None,
    ) -> list[Event]:
        """Events with offset > after, ascending, at most ``limit``, and at
        most ``max_bytes`` bytes of them when given (sizes as stored, the
        figure ``max_event_bytes`` checks; the first event is returned
        whatever its size). A page cut by ``max_bytes`` holds fewer than
        ``limit`` events though more follow: read on from its last offset
        until a page is empty.

        A cursor beyond the head is ``InvalidCursor``; a cursor whose next
        event was removed by retention is ``CursorGone``. A stream that was
        never created reads like an empty one (``[]``, and any cursor past 0
        is beyond its head): streams are created by their first append, and
        a reader may start first. ``read_page`` says whether it exists.
        """
        page = await self.read_page(after, limit, include_ephemeral=include_ephemeral, max_bytes=max_bytes)
        if not page.exists:
            self._check_cursor(page, after)  # as an empty stream: a cursor past 0 is beyond its head
        return page.events

    async def read_page(
        self, after: int = 0, limit: int = 1000, *, include_ephemeral: bool = False,
        max_bytes: int | None = None,
    ) -> ReadPage:
        """``read``, with what the read saw of the stream in the same snapshot:
        ``exists`` (False: never created), ``head``, ``pruned_through`` and
        ``closed``; ``capped`` says that ``max_bytes`` ended the page (events
        after it remain), ``sizes`` each event's size. The cursor is checked against an existing stream only (a
        missing one is an empty page with ``exists`` False, whatever the
        cursor). The HTTP API answers 404 ``stream_not_found`` when the
        stream does not exist; tails end when it is closed and read through."""
        check_offset(after, "after")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_READ_LIMIT:
            raise errors.InvalidInput(f"limit must be 1-{MAX_READ_LIMIT}", field="limit")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise errors.InvalidInput("max_bytes must be a positive integer or None", field="max_bytes")
        admission = await self.admission(READ)
        page = await self.read_admitted(after, limit, include_ephemeral=include_ephemeral, max_bytes=max_bytes)
        if admission.redactor is not None and page.events:
            page = replace(page, events=admission.mask(page.events))
        return page

    async def read_admitted(
        self, after: int, limit: int, *, include_ephemeral: bool, max_bytes: int | None
    ) -> ReadPage:
        """``read_page`` as stored, for a reader that was admitted already
        and masks what it hands on itself (a tail: ``tail.py``; its page may
        be shared with other readers)."""
        page = await self.kernel.store().read(self.tenant, self.path, after, limit, max_bytes)
        if not page.exists:
            return page
        self._check_cursor(page, after)
        if include_ephemeral:
            buffer = self.kernel.buffers.get(self.tenant, self.path)
            if buffer is not None:
                await buffer.settled()  # this process's ephemeral commit in flight
            if self.kernel.store().relays_ephemeral:
                # Other processes' ephemeral events of this range, still on their way.
                upto = page.events[-1].offset if page.capped or len(page.events) >= limit else page.head
                await self.kernel.relay.settle(self.tenant, self.path, page, after, upto)
                buffer = self.kernel.buffers.get(self.tenant, self.path)
            if buffer is not None:
                buffer = self.kernel.buffers.of_lifetime(buffer, page.stream_id)
            if buffer is not None:
                return buffer.merge_page(page, after, limit, max_bytes)
        return page

    async def get(self, offset: int) -> Event:
        """The event at ``offset`` (an ephemeral one while it is still buffered);
        ``StreamNotFound`` if the stream was never created, as ``info``."""
        check_offset(offset, "offset")
        if offset == 0:
            raise errors.InvalidInput("offsets start at 1", field="offset")
        admission = await self.admission(READ)
        (event,) = admission.mask([await self._get(offset)])
        return event

    async def _get(self, offset: int) -> Event:
        page = await self.kernel.store().read_one(self.tenant, self.path, offset)
        if not page.exists:
            raise errors.StreamNotFound(f"stream {self.path} does not exist", path=self.path)
        if page.events:
            return page.events[0]
        if offset <= page.head and self.kernel.store().relays_ephemeral:
            await self.kernel.relay.settle_one(self.tenant, self.path, offset, page.head)
        buffer = self.kernel.buffers.get(self.tenant, self.path)
        ephemeral = buffer.get(offset) if buffer is not None else None
        if ephemeral is not None:
            return ephemeral
        if offset <= page.pruned_through:
            raise errors.CursorGone(
                f"event {offset} was removed by retention",
                requested=offset,
                earliest=page.pruned_through + 1,
                latest=page.head,
                reason="retention",
            )
        raise errors.EventNotFound(f"no event at offset {offset}", offset=offset, latest=page.head)

    async def receipt(self, offset: int) -> dict[str, Any]:
        """The append receipt of the record at ``offset`` (``receipts.py``): of
        the record as stored, whatever this caller's reads mask."""
        check_offset(offset, "offset")
        if offset == 0:
            raise errors.InvalidInput("offsets start at 1", field="offset")
        await self.admission(READ)
        event = await self._get(offset)
        if event.ephemeral:
            raise errors.EventNotFound(f"record {offset} is ephemeral: it has no receipt", offset=offset)
        return receipt(event)

    async def appended_receipt(self, offset: int) -> dict[str, Any]:
        """The receipt of a record this caller has just appended, read back
        as stored (its metadata may hold a trace context, ``tracing.py``);
        no read check: the caller wrote it."""
        return receipt(await self._get(offset))

    def tail(
        self,
        after: int = 0,
        *,
        include_ephemeral: bool = True,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
    ) -> AsyncIterator[Event]:
        """Every event with offset > after, then live ones as they commit, until
        the stream is closed: once a tail has read through the head of a
        closed stream (a close while it runs included), it ends.

        ``filter`` (``Filter(types=..., where=...)``) keeps only the events it
        matches; an expression that fails to evaluate on an event ends the
        tail with ``filter_failed``."""
        check_offset(after, "after")
        event_filter = None if filter is None else Filter.from_dict(filter)
        if event_filter is not None and event_filter.key is not None:
            raise errors.InvalidFilter("a tail's filter has no routing key", field="key")
        return tail(
            self,
            after,
            include_ephemeral=include_ephemeral,
            sweep_s=self.kernel.tail_sweep_s,
            event_filter=event_filter,
        )

    async def gaps(self, limit: int = 100) -> list[GapEvidence]:
        """Evidence of live gaps repaired on this stream's tails (``gaps.py``), newest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_GAPS:
            raise errors.InvalidInput(f"limit must be 1-{MAX_GAPS}", field="limit")
        await self.admission(CONFIGURE)
        return await self.kernel.store().gaps(self.tenant, self.path, limit)

    async def open_connection(
        self,
        *,
        connection_key: str,
        on_batch: Callable[[Any], Awaitable[Any]],
        replay_after: int | None = None,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        events: bool = True,
        include_ephemeral: bool = True,
    ) -> Connection:
        """A session connection: ``await on_batch(events)`` with the events
        after ``replay_after`` (None: only those appended from now on), then
        with new ones as they commit, those ``filter`` matches, ephemeral
        ones included; with ``events=False``, ``await on_batch(state)`` with
        the stream's reduced state (subscription catalogue, processor
        states) now and whenever it changes. A second connection with the
        same ``connection_key`` on this stream replaces this one; ``close()``
        (or ``async with``) ends it. Nothing is appended to the stream: its
        opening and end are facts on ``/``. See streams/connections.py."""
        if (await self.admission(READ)).redactor is not None:
            raise errors.DataHandlingPinned(
                f"stream {self.path} masks what this caller reads: session connections are not masked; "
                "use subscribe", path=self.path,
            )
        return await self.kernel.connections.open(
            self, connection_key, on_batch, replay_after=replay_after, filter=filter, events=events,
            include_ephemeral=include_ephemeral,
        )

    # --- subscriptions (yoke/subscriptions) --------------------------------------

    async def subscribe(
        self,
        name: str | None,
        receiver: Receiver,
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        transform: str | None = None,
        start: str = "now",
        on_failing_event: str = "halt",
    ) -> Subscribed:
        """Deliver this stream's events to ``receiver`` (``copy_to_stream``,
        ``call``, ``processor`` or ``webhook``), durably: appends a
        ``yoke.subscription.configured`` event. ``name`` None generates
        ``subscription:<offset>``; the same name with an identical
        configuration returns the original configure event."""
        subscriptions = await self._subscriptions(CONFIGURE)
        target = getattr(receiver, "path", None)
        if isinstance(target, str):  # a copy appends to its target: as this caller would
            await self.at(target).admission(APPEND)
        return await subscriptions.subscribe(
            name, receiver, filter=filter, transform=transform, start=start,
            on_failing_event=on_failing_event,
        )

    async def subscribe_to_events_from(
        self,
        source: str | Stream,
        *,
        name: str | None = None,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        transform: str | None = None,
        start: str = "now",
    ) -> Subscribed:
        """Declared on this (receiving) stream: copy the events of ``source``
        (a path of the same tenant, or its handle) that match ``filter``
        into this stream. The same durable configuration as
        ``source.subscribe(name, copy_to_stream(self.path), ...)``: a
        ``yoke.subscription.configured`` event in the source's log, the
        source's cursor and retry ladder, this stream's passive fence; the
        receiving stream stores nothing at configure time."""
        if isinstance(source, Stream):
            if source.tenant != self.tenant:
                raise errors.InvalidSubscription(
                    "a copy subscription stays within one tenant", field="source"
                )
            source = source.path
        if not isinstance(source, str):
            raise errors.InvalidInput("source is a stream path or a Stream", field="source")
        return await self.at(source).subscribe(
            name, copy_to_stream(self.path), filter=filter, transform=transform, start=start,
        )

    async def unsubscribe(self, name: str) -> None:
        """Remove the subscription (appends ``yoke.subscription.removed``)."""
        await (await self._subscriptions(CONFIGURE)).unsubscribe(name)

    async def set_cursor(self, name: str, after_offset: int) -> SubscriptionStatus:
        """Deliver again from ``after_offset + 1`` (not beyond the head); a new delivery run."""
        return await (await self._subscriptions(CONFIGURE)).set_cursor(name, after_offset)

    async def pause(self, name: str) -> SubscriptionStatus:
        """Park the subscription (appends ``yoke.subscription.paused``): delivery
        stops, the cursor stays, its status says ``parked``; ``resume`` continues."""
        return await (await self._subscriptions(CONFIGURE)).pause(name)

    async def halt(self, name: str) -> SubscriptionStatus:
        """Halt the subscription by command (appends ``yoke.subscription.halted``
        with reason ``operator``); only ``resume`` (or a cursor move with resume)
        starts it again, never a deployment."""
        return await (await self._subscriptions(CONFIGURE)).halt(name)

    async def resume(self, name: str) -> SubscriptionStatus:
        """Resume a halted or parked subscription where it stopped."""
        return await (await self._subscriptions(CONFIGURE)).resume(name)

    async def set_cursor_and_resume(self, name: str, after_offset: int) -> SubscriptionStatus:
        return await (await self._subscriptions(CONFIGURE)).set_cursor_and_resume(name, after_offset)

    async def subscription(self, name: str) -> SubscriptionStatus:
        """Configuration, cursor, lag, halt reason, last error, attempts, next retry."""
        return await (await self._subscriptions(READ)).get(name)

    async def subscriptions(self) -> list[SubscriptionStatus]:
        return await (await self._subscriptions(READ)).list()

    async def subscription_history(self, name: str, *, after: int = 0, scan: int = HISTORY_SCAN) -> History:
        """The subscription's control events from this stream's log (a page:
        read on after ``scanned_through`` until it reaches ``head``)."""
        return await (await self._subscriptions(READ)).history(name, after=after, scan=scan)

    async def wait_until_processed(
        self, name: str, offset: int, timeout_s: float = 20.0
    ) -> SubscriptionStatus:
        """Wait until the subscription's receiver acknowledged everything through ``offset``."""
        return await (await self._subscriptions(READ)).wait_until_processed(name, offset, timeout_s)

    async def rebuild_subscriptions(self) -> list[SubscriptionStatus]:
        """Recompute the subscription catalogue from this stream's log."""
        return await (await self._subscriptions(CONFIGURE)).rebuild()

    async def _subscriptions(self, action: str) -> Subscriptions:
        await self.admission(action)
        return self.subscription_operator()

    def subscription_operator(self) -> Subscriptions:
        """The subscriptions of this stream, operated without asking the
        rules again (the methods above admit first; the runtime's catalogue
        check on open is the application's)."""
        k = self.kernel
        return Subscriptions(
            k.store, k.appends, k.signals, self.tenant, self.path, self.info, clock=k.clock
        )

    # --- settings --------------------------------------------------------------

    async def info(self) -> StreamInfo:
        await self.admission(READ)
        info = await self.kernel.store().info(self.tenant, self.path)
        if info is None:
            raise errors.StreamNotFound(f"stream {self.path} does not exist", path=self.path)
        return info

    async def create(
        self,
        *,
        max_age_s: float | None = None,
        max_events: int | None = None,
        limits: Limits | None = None,
        pinned: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> StreamInfo:
        """Create the stream with this definition (retention, limits, metadata;
        omitted parts take their defaults). If it exists with the same
        definition it is returned as is; with another one (or, asked
        ``pinned``, a stream that is not pinned) ``StreamExists``, nothing
        changed: settings change through ``set_retention`` and friends.

        ``pinned`` makes it a definition: its retention, limits and metadata
        can never change afterwards."""
        info, _ = await self.create_if_missing(
            max_age_s=max_age_s, max_events=max_events, limits=limits, pinned=pinned, metadata=metadata
        )
        return info

    async def create_if_missing(
        self,
        *,
        max_age_s: float | None = None,
        max_events: int | None = None,
        limits: Limits | None = None,
        pinned: bool = False,
        metadata: Mapping[str, Any] | None = None,
        data_handling: DataHandling | None = None,
    ) -> tuple[StreamInfo, bool]:
        """Like ``create``; also says whether this call created the stream.
        ``data_handling``: a workflow definition's pins (``pins.py``; only
        with ``pinned``)."""
        if metadata is not None and not isinstance(metadata, Mapping):
            raise errors.InvalidInput("metadata must be an object", field="metadata")
        if metadata:
            json_text(metadata, "metadata")
        settings = StreamSettings(
            retention=_check_retention(max_age_s, max_events),
            limits=check_limits(limits or Limits()),
            pinned=bool(pinned),
            metadata=dict(metadata or {}),
            data_handling=None if data_handling is None else data_handling.to_dict(),
        )
        if data_handling is not None and not pinned:
            raise errors.InvalidInput("data handling is pinned by a definition: give pinned=True", field="pinned")
        if data_handling is not None and not may_pin(self.path):
            raise errors.InvalidInput(
                "only workflow streams (paths under /runs/) pin data handling", field="data_handling"
            )
        await self.admission(CONFIGURE)  # an existing stream's pins decide who may define it again
        info, created = await self.kernel.store().create_stream(
            self.tenant, self.path, new_stream_id(), self.kernel.now_ms(), settings
        )
        if created:
            self.kernel.hub.wake(self.tenant, GLOBAL)  # its yoke.stream.created fact
        if not created and (
            (info.retention, info.limits) != (settings.retention, settings.limits)
            or json_text(info.metadata, "metadata") != json_text(settings.metadata, "metadata")  # true is not 1
            or (settings.pinned and not info.pinned)
            or info.data_handling != settings.data_handling
        ):
            raise errors.StreamExists(
                f"stream {info.path} already exists with another definition", path=info.path,
                existing={**definition_of(info), "pinned": info.pinned},
            )
        return info, created

    async def _update(self, **changes: Any) -> StreamInfo:
        await self.admission(CONFIGURE)
        info = await self.kernel.store().update_stream(self.tenant, self.path, **changes)
        if info is None:
            raise errors.StreamNotFound(f"stream {self.path} does not exist", path=self.path)
        return info

    async def close(self) -> StreamInfo:
        """Close the stream: later appends fail with ``StreamClosed``; reads still
        work; tails end once they have delivered everything up to the head."""
        info = await self._update(closed=True)
        self.kernel.hub.wake(self.tenant, self.path)  # live tails read through and end
        self.kernel.hub.wake(self.tenant, GLOBAL)  # the yoke.stream.closed fact
        return info

    async def delete(self) -> StreamInfo:
        """Delete the stream and everything kept for it, in one transaction:
        its events, consumers, objects (and their bytes), fan-out cursor, the
        subscriptions it is the source of (with their processor checkpoints)
        and the passive-fence records it keeps as a receiver. Returns the
        deleted stream as it was.

        Open tails of it end (Python: the iteration stops; SSE: a final
        ``deleted`` event). The path can be created again, by ``create`` or
        an append, as a new stream: a new ``stream_id`` and ``created_at``,
        offsets from 1; a subscription of the old one never delivers again.
        Refused with ``LegalHold`` while a legal hold is on, and for the
        tenant's global stream ``/`` (``GlobalStreamKept``)."""
        if self.path == "/":
            raise errors.GlobalStreamKept(
                "the tenant's global stream / cannot be deleted", path=self.path
            )
        await self.admission(DELETE)
        info = await self.kernel.store().info(self.tenant, self.path)
        if info is None:
            raise errors.StreamNotFound(f"stream {self.path} does not exist", path=self.path)
        # Lifetimes are ordered by created_at (the receivers' fence compares
        # it): a path created again within the old one's millisecond would
        # tie with it. So the clock must have passed it (at most 1 ms).
        ahead_ms = info.created_at - self.kernel.now_ms() + 1
        if ahead_ms > 0:
            await asyncio.sleep(min(ahead_ms, 1000) / 1000)
        deleted = await self.kernel.store().delete_stream(self.tenant, self.path)
        if deleted is None:
            raise errors.StreamNotFound(f"stream {self.path} does not exist", path=self.path)
        await self.kernel.signals.stream_deleted.emit(self.tenant, self.path)
        return deleted

    async def set_retention(
        self, *, max_age_s: float | None = None, max_events: int | None = None
    ) -> StreamInfo:
        """Keep events younger than ``max_age_s`` and the newest ``max_events``
        (None: no limit). Pruning passes remove the rest unless a legal hold is on."""
        return await self._update(retention=_check_retention(max_age_s, max_events))

    async def set_limits(self, limits: Limits) -> StreamInfo:
        """Producer credit ceilings and the overflow policy (see ``Limits``)."""
        return await self._update(limits=check_limits(limits))

    async def set_legal_hold(self, on: bool) -> StreamInfo:
        """While on, retention removes nothing from this stream."""
        if not isinstance(on, bool):
            raise errors.InvalidInput("legal hold is true or false", field="legal_hold")
        return await self._update(legal_hold=on)

    # --- consumers -------------------------------------------------------------

    async def ack(self, consumer: str, offset: int) -> ConsumerInfo:
        """Record that ``consumer`` has processed everything through ``offset``.

        Acknowledgements only advance (``AckRegression``) and never pass the
        head (``InvalidAck``); the first ack creates the consumer. The minimum
        acknowledgement over all consumers frees producer credit."""
        _check_consumer(consumer)
        check_offset(offset, "offset")
        await self.admission(READ)
        info = await self.kernel.store().ack(self.tenant, self.path, consumer, offset, self.kernel.now_ms())
        self.kernel.hub.wake(self.tenant, self.path)  # producers waiting for credit
        return info

    async def consumers(self) -> list[ConsumerInfo]:
        await self.admission(READ)
        return await self.kernel.store().consumers(self.tenant, self.path)

    async def remove_consumer(self, consumer: str) -> bool:
        _check_consumer(consumer)
        await self.admission(READ)
        removed = await self.kernel.store().delete_consumer(self.tenant, self.path, consumer)
        self.kernel.hub.wake(self.tenant, self.path)
        return removed


def definition_of(info: StreamInfo) -> dict[str, Any]:
    """What a create request defines: retention, limits, metadata (and the
    data handling a workflow definition pins)."""
    definition = {"retention": asdict(info.retention), "limits": asdict(info.limits), "metadata": info.metadata}
    if info.data_handling is not None:
        definition["data_handling"] = info.data_handling
    return definition


CONSUMER_RE = re.compile(r"[A-Za-z0-9._:@\-]{1,128}")


def _check_consumer(consumer: Any) -> str:
    if not isinstance(consumer, str) or not CONSUMER_RE.fullmatch(consumer):
        raise errors.InvalidInput(
            "a consumer id is 1-128 characters of A-Z a-z 0-9 . _ : @ -", field="consumer"
        )
    return consumer


def check_limits(limits: Limits) -> Limits:
    for name in ("max_unread_events", "max_unread_bytes", "max_total_events", "max_total_bytes"):
        _check_count(getattr(limits, name), name)
    if limits.overflow not in ("reject", "block"):
        raise errors.InvalidInput("overflow is 'reject' or 'block'", field="overflow")
    timeout = limits.block_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise errors.InvalidInput("block_timeout_s must be in (0, 300]", field="block_timeout_s")
    return limits
