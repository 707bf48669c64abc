"""The op handler: every kernel call an actor makes, as a method name and
JSON params.

``ctx`` (context.py) turns each call into ``await ops.call(method, params)``
and this module carries it out. Keeping the surface to names and JSON values
is the seam where user code can later run in another process; actor code
never touches the store, and there is no op to read or tail a stream.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..events import MAX_DEPTH, MAX_INT, MIN_INT, PreparedEvent, json_bytes, new_event_id, prepare, validate_path
from ..hosts.wire import sql_params_from_wire
from ..store.actors import Effect, InstanceInfo, Message, Schedule
from ..streams.append import new_stream_id, refusal_error
from ..streams.rules import APPEND
from ..tracing import carrier_of, in_run, op_event
from .context import CONVERSATION_EVENT, CONVERSATION_STREAM, PortalContext
from .instances import Instances
from .journal import EFFECT_OPS, Journal
from .tape import TAPED_OPS, Tape

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .app import App
    from .atomic import AtomicRun
    from .kernel import ActorKernel

log = logging.getLogger("yoke.actors.portals")  # what it logs: portal methods' failures

MAX_SCHEDULE_NAME = 200
CALL_TIMEOUT_S = 30.0  # ctx.portals.call's default
MAX_CALL_TIMEOUT_S = 3600.0
# How deep an op's params wrap its documents: {"event": {"payload": ...}}.
PARAMS_WRAPPING = 2


def _milliseconds(seconds: float) -> int:
    """``seconds`` as whole milliseconds; beyond a float's range (1e306 s)
    out of the signed 64-bit range, which the caller refuses."""
    ms = seconds * 1000
    return int(ms) if math.isfinite(ms) else MAX_INT + 1


def instance_dict(info: InstanceInfo) -> dict[str, Any]:
    return {
        "instance_id": info.instance_id,  # as ctx.instance names it
        "id": info.instance_id,  # the same: what this answer first said
        "tenant": info.tenant,
        "actor": info.actor,
        "key": info.key,
        "config": info.config,
        "filter": info.filter,
        "parent_id": info.parent_id,
        "created_at": info.created_at,
    }


def message_dict(m: Message) -> dict[str, Any]:
    return {
        "conversation_id": m.conversation_id,
        "message_id": m.message_id,
        "seq": m.seq,
        "role": m.role,
        "content": m.content,
        "metadata": m.metadata,
        "at": m.at,
        "offset": m.offset,
    }


class OpHandler:
    """Ops of one instance (``instance`` may be None for portals). With a
    ``journal`` (a run of a queue row), effect ops are journaled: a retry of
    the row repeats none that already committed (journal.py). ``app`` and
    ``worker_id`` are the application (its actors and portals) and this
    process's executor, as ``Instances`` takes them."""

    def __init__(
        self, kernel: ActorKernel, app: App | None, tenant: str, instance: InstanceInfo | None,
        journal: Journal | None = None, *, worker_id: str | None = None, span: Span | None = None,
        tape: Tape | None = None,
    ) -> None:
        self.kernel = kernel
        # A run's record of what it did and read outside its database (tape.py).
        self.tape = tape
        # The run attempt's span (tracing.py): each op is an event on it, and
        # what the run appends carries its context.
        self.span = span
        self.app = app
        self.worker_id = worker_id
        self.tenant = tenant
        self.instance = instance
        self.journal = journal
        self.atomic: AtomicRun | None = None  # an atomic run's: effects wait for its commit
        self._rng: random.Random | None = None  # ctx.random()'s, seeded on first use

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        handler = OPS.get(method)
        if handler is None:
            raise errors.InvalidInput(f"unknown op {method!r}", op=method)
        # Params cross the seam as JSON: anything else fails here, in-process
        # too, and so does a value outside the domain (NaN is not null). They
        # wrap the op's documents two levels deep ({"event": {"payload": ..}}),
        # each checked again where it is stored: a payload the API takes
        # passes here too.
        p = orjson.loads(json_bytes(params, "params", depth=MAX_DEPTH + PARAMS_WRAPPING))
        if self.tape is not None and method in TAPED_OPS:
            return await self._taped(handler, method, p)
        return await self._traced(handler, method, p)

    async def _taped(self, handler: Any, method: str, p: dict[str, Any]) -> Any:
        try:
            answer = await self._traced(handler, method, p)
        except Exception as exc:
            self.tape.failed(method, p, exc)  # type: ignore[union-attr]
            raise
        self.tape.op(method, p, answer)  # type: ignore[union-attr]
        return answer

    async def _traced(self, handler: Any, method: str, p: dict[str, Any]) -> Any:
        if self.span is None:
            return await self._call(handler, method, p)
        started = time.perf_counter()
        try:
            with in_run(self.span):
                answer = await self._call(handler, method, p)
        except BaseException as exc:
            op_event(self.span, method, started, error=exc)
            raise
        if method != "stream_append":  # which says itself whether the journal answered it
            op_event(self.span, method, started)
        return answer

    async def _call(self, handler: Any, method: str, p: dict[str, Any]) -> Any:
        if method in EFFECT_OPS:
            effect = None if self.journal is None else self.journal.effect(method, p)
            return await handler(self, p, effect)
        return await handler(self, p)

    def _need_instance(self) -> InstanceInfo:
        if self.instance is None:
            raise errors.InvalidInput("this op needs an actor instance")
        return self.instance

    def now(self) -> float:
        now = self.kernel.clock.wall()
        return now if self.tape is None else self.tape.reading(now)

    def random(self) -> float:
        if self._rng is None:
            seed = secrets.randbits(64)
            if self.tape is not None:
                self.tape.seed = seed
            self._rng = random.Random(seed)
        return self._rng.random()

    def seed(self) -> int:
        """A host run's seed for its ctx.random() (kept on the tape)."""
        seed = secrets.randbits(64)
        if self.tape is not None:
            self.tape.seed = seed
        return seed

    def clock_reading(self) -> tuple[float, bool]:
        """The clock a host's run starts from (its ctx.now() runs on from it)."""
        now = self.kernel.clock.wall()
        if self.tape is not None:
            self.tape.reading(now)
        return now, not getattr(self.kernel.clock, "stands_still", False)

    def update_lock(self) -> asyncio.Lock:
        """A process-local lock for one instance's ctx.state.update."""
        return self._db().update_lock

    def _db(self):  # noqa: ANN202
        if self.atomic is not None:  # the run's own, even when its owner forgot it
            return self.atomic.db
        instance = self._need_instance()
        return self.kernel.state_databases().get(self.tenant, instance.instance_id)

    # --- streams -------------------------------------------------------------

    async def _stream_append(self, p: dict[str, Any], effect: Effect | None) -> dict[str, Any]:
        started = time.perf_counter()
        event = dict(p["event"])
        if self.instance is not None and event.get("source") is None:
            event["source"] = {"actor": self.instance.actor, "instance": self.instance.instance_id}
        path = p.get("stream") or "/"
        stream = self.kernel.stream(path, self.tenant)
        if self.atomic is not None:
            # Committed with the run, not through the stream: its rules first.
            admission = await stream.admission(APPEND)
            admission.check_records([event])
            if admission.input_wake is not None:
                raise errors.DataHandlingPinned(
                    f"stream {path} takes input records with their delivery outbox: an atomic run cannot "
                    "append to it", path=path,
                )
            return self.atomic.append(path, event, None if self.span is None else carrier_of(self.span))
        journaled = effect is not None and self.journal is not None and event.get("idempotency_key") is None \
            and not event.get("ephemeral")
        if journaled:
            # The journal is the key: a retry's identical append finds its event.
            event["idempotency_key"] = self.journal.append_key(effect)  # type: ignore[union-attr, arg-type]
            result = (await stream._append([event], trusted=False, kernel_key=True))[0]
        else:
            result = await stream.append(event)
        # A retry's append the journal answered made no event: the op says so.
        op_event(self.span, "stream_append", started, replayed=result.duplicate and journaled)
        return {"offset": result.offset, "id": result.id}

    # --- state and sqlite ----------------------------------------------------

    async def _state_get(self, p: dict[str, Any]) -> dict[str, Any]:
        value, version = await self._db().state_get()
        return {"value": value, "version": version}

    async def _state_set(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"version": await self._db().state_set(p["value"])}

    async def _state_cas(self, p: dict[str, Any]) -> dict[str, Any]:
        ok, version = await self._db().state_cas(p["expected"], p["value"])
        return {"ok": ok, "version": version}

    # Params arrive as JSON, BLOBs and big integers tagged (hosts/wire.py).
    async def _sqlite_exec(self, p: dict[str, Any]) -> dict[str, Any]:
        return await self._db().execute(p["sql"], sql_params_from_wire(p.get("params") or ()))

    async def _sqlite_query(self, p: dict[str, Any]) -> list[dict[str, Any]]:
        return await self._db().query(p["sql"], sql_params_from_wire(p.get("params") or ()))

    # --- instances -----------------------------------------------------------

    async def _instances_create(self, p: dict[str, Any], effect: Effect | None) -> dict[str, Any]:
        parent = None if self.instance is None else self.instance.instance_id
        instances = Instances(self.kernel, self.tenant, app=self.app, worker_id=self.worker_id)
        if self.atomic is not None:
            new = instances.new_instance(p["actor"], p.get("key"), p.get("config"), filter=p.get("filter"),
                                         parent_id=parent)
            return instance_dict(await self.atomic.create_instance(new))
        info = await instances.create(
            p["actor"], p.get("key"), p.get("config"), filter=p.get("filter"), parent_id=parent,
            effect=effect,
        )
        return instance_dict(info)

    # --- portals -------------------------------------------------------------

    async def _portal_call(self, p: dict[str, Any]) -> Any:
        self._need_instance()
        name, method = p.get("portal"), p.get("method")
        for field, value in (("portal", name), ("method", method)):
            if not isinstance(value, str) or not 1 <= len(value) <= 200:
                raise errors.InvalidInput(f"{field} must be 1-200 characters", field=field)
        timeout_s = check_timeout(p.get("timeout_s", CALL_TIMEOUT_S))
        json_bytes(p.get("params"), "params")  # the seam let them nest deeper than the domain
        return await call_method(self, self.tenant, name, method, p.get("params"), timeout_s)

    # --- schedules -----------------------------------------------------------

    async def _schedules_upsert(self, p: dict[str, Any], effect: Effect | None) -> dict[str, Any]:
        schedule = self._schedule(p)
        if self.atomic is not None:
            return self.atomic.upsert_schedule(schedule)
        due = await self.kernel.actors().upsert_schedule(schedule, effect)
        self.kernel.signals.timers_changed.emit(due)
        return {"name": schedule.name, "due_at": due}

    def _schedule(self, p: dict[str, Any]) -> Schedule:
        """The schedule ``schedules_upsert`` asks for, checked."""
        instance = self._need_instance()
        name = p.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_SCHEDULE_NAME:
            raise errors.InvalidSchedule(f"a schedule name is 1-{MAX_SCHEDULE_NAME} characters", field="name")
        when = [k for k in ("at", "after_s", "cron") if p.get(k) is not None]
        if len(when) != 1:
            raise errors.InvalidSchedule("give exactly one of at, after_s or cron")
        now = self.kernel.now_ms()
        cron = p.get("cron")
        if cron is not None:
            due = next_cron(cron, now)
        elif p.get("after_s") is not None:
            after = p["after_s"]
            if not isinstance(after, (int, float)) or isinstance(after, bool) or after < 0:
                raise errors.InvalidSchedule("after_s must be a non-negative number", field="after_s")
            due = now + _milliseconds(after)
        else:
            at = p["at"]
            if not isinstance(at, (int, float)) or isinstance(at, bool):
                raise errors.InvalidSchedule("at must be a datetime or epoch seconds", field="at")
            due = _milliseconds(at)
        if not MIN_INT <= due <= MAX_INT:  # both stores keep it as a signed 64-bit integer
            raise errors.InvalidSchedule(f"{when[0]} is out of range", field=when[0])
        event = p.get("event")
        prepare(event or {})  # the event must be valid input now, not when it fires
        stream = p.get("stream")
        if stream is not None:
            validate_path(stream)
        return Schedule(self.tenant, instance.instance_id, name, due, event, cron, stream, now)

    async def _schedules_cancel(self, p: dict[str, Any], effect: Effect | None) -> dict[str, Any]:
        instance = self._need_instance()
        if self.atomic is not None:
            return await self.atomic.cancel_schedule(str(p["name"]))
        found = await self.kernel.actors().cancel_schedule(
            self.tenant, instance.instance_id, str(p["name"]), effect
        )
        return {"cancelled": found}

    async def _schedules_list(self, p: dict[str, Any]) -> list[dict[str, Any]]:
        instance = self._need_instance()
        rows = await self.kernel.actors().schedules(self.tenant, instance.instance_id)
        return [
            {"name": s.name, "due_at": s.due_at, "cron": s.cron, "event": s.event, "stream": s.stream}
            for s in rows
        ]

    # --- conversations -------------------------------------------------------

    async def _conversations_post(self, p: dict[str, Any], effect: Effect | None) -> dict[str, Any]:
        message, event = self._message(p)
        if self.atomic is not None:
            return self.atomic.post_message(message, event)
        message, outcome = await self.kernel.actors().post_message(
            self.tenant, CONVERSATION_STREAM, message, event, self.kernel.now_ms(), new_stream_id(), effect,
        )
        if message is None:
            raise refusal_error(outcome.status, CONVERSATION_STREAM, [event])
        if outcome.status == "ok":  # not a journaled repeat
            self.kernel.appended(self.tenant, CONVERSATION_STREAM, 1)
        return message_dict(message)

    def _message(self, p: dict[str, Any]) -> tuple[Message, PreparedEvent]:
        """The message ``conversations_post`` asks for, checked, and its event."""
        conversation_id, role = p.get("conversation_id"), p.get("role")
        for field, value in (("conversation_id", conversation_id), ("role", role)):
            if not isinstance(value, str) or not 1 <= len(value) <= 200:
                raise errors.InvalidInput(f"{field} must be 1-200 characters", field=field)
        metadata = p.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise errors.InvalidInput("metadata must be an object", field="metadata")
        for field in ("content", "metadata"):  # the seam let them nest deeper than the domain
            json_bytes(p.get(field), field)
        message_id = "msg_" + new_event_id()
        source = None
        if self.instance is not None:
            source = {"actor": self.instance.actor, "instance": self.instance.instance_id}
        event = prepare(
            {
                "type": CONVERSATION_EVENT,
                "payload": {"conversation_id": conversation_id, "message_id": message_id},
                "correlation": conversation_id,
                "source": source,
            }
        )
        return Message(conversation_id, message_id, 0, role, p.get("content"), metadata, 0, None), event

    async def _conversations_messages(self, p: dict[str, Any]) -> list[dict[str, Any]]:
        limit = p.get("limit", 100)
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise errors.InvalidInput("limit must be 1-1000", field="limit")
        rows = await self.kernel.actors().messages(
            self.tenant, str(p["conversation_id"]), p.get("after"), limit
        )
        return [message_dict(m) for m in rows]


# The ops by name (one table for every handler).
OPS: dict[str, Callable[[OpHandler, dict[str, Any]], Awaitable[Any]]] = {
    "stream_append": OpHandler._stream_append,
    "state_get": OpHandler._state_get,
    "state_set": OpHandler._state_set,
    "state_cas": OpHandler._state_cas,
    "sqlite_exec": OpHandler._sqlite_exec,
    "sqlite_query": OpHandler._sqlite_query,
    "instances_create": OpHandler._instances_create,
    "portal_call": OpHandler._portal_call,
    "schedules_upsert": OpHandler._schedules_upsert,
    "schedules_cancel": OpHandler._schedules_cancel,
    "schedules_list": OpHandler._schedules_list,
    "conversations_post": OpHandler._conversations_post,
    "conversations_messages": OpHandler._conversations_messages,
}


def check_timeout(timeout_s: Any) -> float:
    if (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s <= MAX_CALL_TIMEOUT_S
    ):
        raise errors.InvalidInput(
            f"timeout_s must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} seconds", field="timeout_s"
        )
    return float(timeout_s)


async def call_method(
    caller: OpHandler, tenant: str, name: str, method: str, params: Any, timeout_s: float
) -> Any:
    """Run a portal method of ``caller``'s application for an actor of
    ``tenant``: the method gets a portal context in that tenant and
    ``params`` (JSON); its answer goes back as JSON. A YokeError it raises
    reaches the caller as it is; any other exception, or an answer that is
    not JSON, is ``PortalCallFailed``; no answer within ``timeout_s`` is
    ``PortalTimeout`` (the method is cancelled)."""
    app = caller.app
    portal = None if app is None else app.portals.get(name)
    if portal is None:
        raise errors.PortalNotFound(f"no portal named {name!r}", portal=name)
    fn = portal.methods.get(method)
    if fn is None:
        raise errors.PortalMethodNotFound(
            f"portal {name!r} has no method {method!r}", portal=name, method=method
        )
    try:
        async with asyncio.timeout(timeout_s):
            ops = OpHandler(caller.kernel, app, tenant, None, worker_id=caller.worker_id)
            result = await fn(PortalContext(ops, portal.name), params)
    except TimeoutError:
        raise errors.PortalTimeout(
            f"portal {name!r} method {method!r} did not answer within {timeout_s:g}s",
            portal=name, method=method, timeout_s=timeout_s,
        ) from None
    except errors.YokeError:
        raise
    except Exception as exc:
        log.warning("portal %s method %s failed: %r", name, method, exc)
        raise errors.PortalCallFailed(
            f"portal {name!r} method {method!r} failed: {type(exc).__name__}: {exc}"[:4096],
            portal=name, method=method, error=type(exc).__name__,
        ) from None
    try:
        return orjson.loads(json_bytes(result, "result"))
    except errors.YokeError as exc:
        raise errors.PortalCallFailed(
            f"portal {name!r} method {method!r} answered a value that is not JSON: {exc.message}",
            portal=name, method=method, error="not_json",
        ) from None


def next_cron(expression: Any, after_ms: int) -> int:
    """The first time strictly after ``after_ms`` the cron expression names (UTC)."""
    from croniter import croniter

    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise errors.InvalidSchedule(f"not a valid cron expression: {expression!r}", field="cron")
    start = dt.datetime.fromtimestamp(after_ms / 1000, tz=dt.timezone.utc)
    return int(croniter(expression, start).get_next(float) * 1000)

