"""``y.failures(tenant)``: one inbox over every parked failure of a tenant.

List them (by kind, receiver, stream, actor, instance, subscription and
time), show one with its event and attempts, replay it as it is or with a
corrected event, discard it with a reason, and do either to every failure a
selection covers. The HTTP API (``/v1/failures``), the CLI (``yoke
failures``), the console and the metrics use these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import errors
from ..events import new_event_id, validate_tenant
from . import dead_letters, subscriptions
from . import outcome as outcomes
from .model import (
    DEAD_LETTER,
    Bulk,
    Failure,
    ReplayOutcome,
    Resolution,
    Selection,
    check_correction,
    check_limit,
    check_one_correction,
    check_patch,
    check_reason,
    corrected,
    parse_id,
    patched,
)

if TYPE_CHECKING:
    from .model import FailureServices

BULK_LIMIT = 1000  # failures one replay or discard by selection covers
MAX_COUNTED = 100_000  # dead letters one count (the metrics) reads per tenant


# One lock per (tenant, failure id) while a replay or discard holds or awaits
# it: in this process, a failure is delivered and recorded by one action at
# a time, and the next finds it resolved. (Across processes the store's
# record still lets one action alone succeed; see docs/advanced/failures.md.)
_claims: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}


@asynccontextmanager
async def claimed(tenant: str, failure_id: str) -> AsyncIterator[None]:
    key = (tenant, failure_id)
    lock, users = _claims.get(key, (asyncio.Lock(), 0))
    _claims[key] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = _claims[key]
        if users == 1:
            del _claims[key]
        else:
            _claims[key] = (lock, users - 1)


class Failures:
    def __init__(self, services: FailureServices, tenant: str) -> None:
        validate_tenant(tenant)
        self.services = services
        self.tenant = tenant

    async def list(
        self, *, kind: str | None = None, receiver: str | None = None, stream: str | None = None,
        actor: str | None = None, instance_id: str | None = None, subscription: str | None = None,
        since: int | None = None, until: int | None = None, limit: int = 100,
    ) -> list[Failure]:
        """Open failures, oldest first (by the time of their last attempt)."""
        check_limit(limit)
        sel = Selection(kind, receiver, stream, actor, instance_id, subscription, since, until)
        return await self.select(sel, limit)

    async def select(self, sel: Selection, limit: int) -> list[Failure]:
        """``list`` with a ``Selection`` and any limit (metrics count them all)."""
        services, tenant = self.services, self.tenant
        found = await dead_letters.dead_failures(services, tenant, sel, limit)  # with their events
        if sel.kind != DEAD_LETTER and sel.receiver != "actor" and not sel.actor and not sel.instance_id:
            rows = [r for r in await subscriptions.subscription_rows(services, tenant)
                    if (sel.stream is None or r.path == sel.stream)
                    and (sel.subscription is None or r.name == sel.subscription)]
            found += await subscriptions.halted_failures(services, rows, events=False)
            found += await subscriptions.skipped_failures(services, tenant, rows, path=sel.stream, events=False)
        wanted = [f for f in found if sel.wants(f)]
        wanted.sort(key=lambda f: (f.failed_at, f.id))
        # Only the page kept reads its subscription failures' events.
        return [await subscriptions.with_event(services, tenant, f) for f in wanted[:limit]]

    async def ages(self) -> list[tuple[str, str, int]]:
        """(kind, receiver, failed_at) of every open failure (up to
        ``MAX_COUNTED`` dead letters), without reading their events: what
        the metrics count at each scrape."""
        services, tenant = self.services, self.tenant
        found = [(DEAD_LETTER, "actor", at) for at in await services.store().actors.dead_letter_times(tenant, MAX_COUNTED)]
        rows = await subscriptions.subscription_rows(services, tenant)
        parked = await subscriptions.halted_failures(services, rows, events=False)
        parked += await subscriptions.skipped_failures(services, tenant, rows, events=False)
        return found + [(f.kind, f.receiver, f.failed_at) for f in parked]

    async def get(self, failure_id: str) -> Failure:
        """One open failure, with its event and attempts; ``FailureNotFound``
        once it was replayed or discarded."""
        kind, c = parse_id(failure_id)
        if kind == DEAD_LETTER:
            return await dead_letters.find(self.services, self.tenant, c[0])
        return await subscriptions.find(self.services, self.tenant, kind, c[0], c[1], c[2])

    async def replay(
        self, failure_id: str, event: dict[str, Any] | None = None, *, patch: dict[str, Any] | None = None,
        wait: bool = False, timeout_s: float = outcomes.DEFAULT_TIMEOUT_S,
    ) -> Resolution:
        """Deliver the failed event again, as it was or corrected: ``patch``
        is a JSON Merge Patch of the event's ``type``, ``payload`` and
        ``metadata`` (``{"payload": {"amount": 12}}`` changes that field and
        keeps the rest); ``event`` (``{type?, payload?, metadata?}``) replaces
        those fields whole.
        A corrected event is a new event (its own id) whose
        ``source.replay_of`` names the original; the original stays in its
        stream. A dead letter goes back to its instance's queue; a halted
        subscription resumes (as it is: its runner delivers the event again;
        corrected: the corrected event is delivered here, then the
        subscription resumes after the original); a skipped event is
        delivered once more to that subscription alone. A
        ``yoke.failure.replayed`` event on the failure's stream records it.

        ``wait``: then wait up to ``timeout_s`` (0-3600) for what becomes of
        the event (``outcome``): the resolution's ``outcome`` says."""
        services = self.services
        check_one_correction(event, patch)
        correction = None if event is None else check_correction(event, services.max_event_bytes)
        patch = None if patch is None else check_patch(patch)
        if wait:
            outcomes.check_timeout(timeout_s)
        parse_id(failure_id)  # FailureNotFound for what is not an id
        async with claimed(self.tenant, failure_id):
            done = await self._replay(failure_id, correction, patch)
        if not wait:
            return done
        return replace(done, outcome=await self.outcome(done, timeout_s=timeout_s))

    async def outcome(self, replayed: Resolution, *, timeout_s: float = outcomes.DEFAULT_TIMEOUT_S) -> ReplayOutcome:
        """What became of the event that ``replayed`` (what ``replay``
        returned) sent again, waiting up to ``timeout_s`` (0-3600) for it to settle:
        ``done`` (a dead letter's row was processed; a halted subscription's
        cursor passed the event; a skip or a corrected halt was delivered in
        the replay itself), ``failed`` (the row is dead again; the
        subscription recorded a new error before passing the event, or
        halted again: ``error``, ``error_at``) or, at the timeout,
        ``pending`` (``detail`` says what is still on its way)."""
        return await outcomes.wait(self.services, self.tenant, replayed, outcomes.check_timeout(timeout_s))

    async def _replay(
        self, failure_id: str, correction: dict[str, Any] | None, patch: dict[str, Any] | None
    ) -> Resolution:
        services = self.services
        failure = await self.get(failure_id)  # under the claim: open, or resolved by the one before
        if patch is not None:  # applied to the event as it is now, under the claim
            correction = check_correction(patched(failure.event or {}, patch), services.max_event_bytes)
        replaying = services.tracing.replaying(self.tenant, "replay", failure=failure.id) if services.tracing.on \
            else contextlib.nullcontext()
        with replaying as replayed_in:
            if failure.kind == DEAD_LETTER:
                qid = parse_id(failure_id)[1][0]
                path, offset = await dead_letters.replay(services, self.tenant, failure, qid, correction, replayed_in)
                return Resolution(failure.id, "replayed", path, offset, failure=failure)
            document = failure.event
            if document is not None and correction is not None:
                document = corrected(document, correction, failure.id, new_event_id())
            offset, delivered = await subscriptions.replay(services, self.tenant, failure, document, correction)
            assert failure.path is not None
            return Resolution(failure.id, "replayed", failure.path, offset, delivered, failure=failure)

    async def fork(
        self, failure_id: str, event: dict[str, Any] | None = None, *, patch: dict[str, Any] | None = None,
        app: Any = None,
    ) -> Any:
        """A dead letter's instance forked through the failed input, that
        input corrected as ``replay`` would correct it (``event`` or
        ``patch``) and under ``app`` (default: the application's code):
        look at its diff, then ``replay`` the fix live (docs/advanced/forks.md)."""
        services = self.services
        check_one_correction(event, patch)
        correction = None if event is None else check_correction(event, services.max_event_bytes)
        patch = None if patch is None else check_patch(patch)
        failure = await self.get(failure_id)
        if failure.kind != DEAD_LETTER or failure.instance_id is None:
            raise errors.InvalidInput("only a dead letter's instance can be forked", field="failure")
        if services.forks is None:
            raise errors.InvalidInput("this process cannot make forks", field="failure")
        if patch is not None:
            correction = check_correction(patched(failure.event or {}, patch), services.max_event_bytes)
        qid = parse_id(failure_id)[1][0]
        return await services.forks(self.tenant).at_dead_letter(failure.instance_id, qid, correction, app=app)

    async def discard(self, failure_id: str, reason: str) -> Resolution:
        """Give up on the failure, saying why: the dead letter is deleted, a
        halted subscription resumes after the event, a skip is closed. A
        ``yoke.failure.discarded`` event on the failure's stream records it."""
        check_reason(reason)
        parse_id(failure_id)
        async with claimed(self.tenant, failure_id):
            return await self._discard(failure_id, reason)

    async def _discard(self, failure_id: str, reason: str) -> Resolution:
        failure = await self.get(failure_id)
        if failure.kind == DEAD_LETTER:
            qid = parse_id(failure_id)[1][0]
            path, offset = await dead_letters.discard(self.services, self.tenant, failure, qid, reason)
            return Resolution(failure.id, "discarded", path, offset)
        offset = await subscriptions.discard(self.services, self.tenant, failure, reason)
        assert failure.path is not None
        return Resolution(failure.id, "discarded", failure.path, offset)

    async def replay_all(
        self, *, event: dict[str, Any] | None = None, patch: dict[str, Any] | None = None, limit: int = BULK_LIMIT,
        check: Callable[[list[Failure]], Awaitable[None]] | None = None, **selection: Any,
    ) -> Bulk:
        """``replay`` every failure the selection (``list``'s filters)
        covers, up to ``limit``, oldest first; a failure that cannot be
        replayed is reported and left open. ``check`` is called with the
        failures selected before any is replayed: what it raises refuses
        them all (the HTTP API refuses corrections on streams that pin their
        data handling; one selection, so none can slip in between)."""
        check_one_correction(event, patch)  # refused as a whole, before anything is selected
        if event is not None:
            check_correction(event, self.services.max_event_bytes)
        if patch is not None:
            check_patch(patch)  # each failure's own event is patched (and checked) when it is replayed
        return await self._each(selection, limit, lambda f: self.replay(f.id, event, patch=patch), check)

    async def discard_all(self, reason: str, *, limit: int = BULK_LIMIT, **selection: Any) -> Bulk:
        check_reason(reason)
        return await self._each(selection, limit, lambda f: self.discard(f.id, reason))

    async def _each(
        self, selection: dict[str, Any], limit: int, act: Any,
        check: Callable[[list[Failure]], Awaitable[None]] | None = None,
    ) -> Bulk:
        check_limit(limit)
        unknown = set(selection) - set(Selection.__dataclass_fields__)
        if unknown:
            raise errors.InvalidInput(f"no failure filter named {', '.join(sorted(unknown))}", field="selection")
        done: list[Resolution] = []
        failed: list[tuple[str, errors.YokeError]] = []
        chosen = await self.select(Selection(**selection), limit)
        if check is not None:
            await check(chosen)
        for failure in chosen:
            try:
                done.append(await act(failure))
            except errors.YokeError as exc:
                failed.append((failure.id, exc))
        return Bulk(done, failed)
