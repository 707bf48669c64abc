"""``ctx``: what ``process(ctx, event)`` (and a portal) can do.

Every call goes through the op handler (ops.py) as a method name and JSON
params. There is deliberately no way to read or tail a stream from here.
This module does not import the op handler: in a host process ``ctx.ops``
is the host's ``RemoteOps`` (hosts/python.py), and nothing here may lead
to the kernel.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol

from .. import errors
from ..events import Event
from ..hosts.wire import sql_from_wire, sql_params_to_wire, sql_rows_from_wire
from ..store.actors import InstanceInfo
from .journal import run_idempotency_key

# ctx.state.update retries a lost compare-and-set this many times.
MAX_UPDATE_RETRIES = 1000


class Ops(Protocol):
    """What ``ctx`` calls: ops.OpHandler in the kernel, RemoteOps in a host."""

    tenant: str

    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    def update_lock(self) -> asyncio.Lock: ...

    def now(self) -> float:
        """The runtime's clock, in seconds since the epoch."""
        ...

    def random(self) -> float:
        """A number in [0, 1) from the run's seed (kept on its tape)."""
        ...


def as_epoch_s(at: Any) -> Any:
    """``at`` as epoch seconds: datetimes are converted, numbers pass."""
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.timezone.utc)
        return at.timestamp()
    return at


def params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class State:
    """The instance's JSON state document with a version."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    async def get(self, default: Any = None) -> Any:
        value = (await self._ops.call("state_get", {}))["value"]
        return default if value is None else value

    async def version(self) -> int:
        return (await self._ops.call("state_get", {}))["version"]

    async def set(self, value: Any) -> int:
        """Overwrite without a version check; returns the new version."""
        return (await self._ops.call("state_set", {"value": value}))["version"]

    async def update(self, fn: Callable[[Any], Any], default: Any = None) -> Any:
        """Read, apply ``fn`` (to ``default`` when there is no state yet),
        compare-and-set; on a concurrent write, reread and apply again.
        Returns the value written."""
        if default is None:
            default = {}
        async with self._ops.update_lock():
            for _ in range(MAX_UPDATE_RETRIES):
                current = await self._ops.call("state_get", {})
                value = current["value"]
                new = fn(default if value is None else value)
                result = await self._ops.call(
                    "state_cas", {"expected": current["version"], "value": new}
                )
                if result["ok"]:
                    return new
        raise RuntimeError("ctx.state.update: too much contention")


class Sqlite:
    """User tables in the instance's SQLite database."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    # Values cross the seam as JSON: BLOBs (bytes), integers beyond 2**53
    # and infinite reals are tagged on the way and untagged here (hosts/wire.py).

    async def exec(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> dict[str, int]:
        """Run a statement; returns ``{"rowcount", "lastrowid"}``."""
        done = await self._ops.call("sqlite_exec", {"sql": sql, "params": sql_params_to_wire(params)})
        return {k: sql_from_wire(v) for k, v in done.items()}

    async def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column name, in the statement's column
        order; a BLOB is ``bytes``."""
        rows = await self._ops.call("sqlite_query", {"sql": sql, "params": sql_params_to_wire(params)})
        return sql_rows_from_wire(rows)


class Schedules:
    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    async def upsert(
        self,
        name: str,
        *,
        event: Mapping[str, Any],
        at: Any = None,
        after_s: float | None = None,
        cron: str | None = None,
        stream: str | None = None,
    ) -> dict[str, Any]:
        """Create or replace the schedule ``name``: at a time (datetime or epoch
        seconds), after a delay, or on a cron expression (UTC). When due, its
        event is enqueued to this instance, or appended to ``stream``."""
        return await self._ops.call(
            "schedules_upsert",
            params(name=name, event=event, at=as_epoch_s(at), after_s=after_s, cron=cron, stream=stream),
        )

    async def cancel(self, name: str) -> bool:
        return (await self._ops.call("schedules_cancel", {"name": name}))["cancelled"]

    async def list(self) -> list[dict[str, Any]]:
        return await self._ops.call("schedules_list", {})


# Where ctx.conversations.post_message's events go (the message is stored
# apart; its event carries ids only), and their type.
CONVERSATION_STREAM = "/"
CONVERSATION_EVENT = "conversation.message.posted"


class Conversations:
    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    async def post_message(
        self, conversation_id: str, role: str, content: Any, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Store the message and append ``conversation.message.posted`` (ids
        only) to the global stream, in one transaction."""
        return await self._ops.call(
            "conversations_post",
            {"conversation_id": conversation_id, "role": role, "content": content,
             "metadata": metadata},
        )

    async def messages(
        self, conversation_id: str, after: int | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Messages after ``after`` (a message ``seq``), oldest first."""
        return await self._ops.call(
            "conversations_messages",
            params(conversation_id=conversation_id, after=after, limit=limit),
        )


class Portals:
    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    async def call(
        self, portal: str, method: str, params: Any = None, *, timeout_s: float | None = None
    ) -> Any:
        """Call ``method`` of the application's portal ``portal`` with JSON
        ``params``; returns its JSON answer. ``timeout_s`` (default 30 s):
        ``PortalTimeout`` when it has not answered by then."""
        call = {"portal": portal, "method": method, "params": params}
        if timeout_s is not None:
            call["timeout_s"] = timeout_s
        return await self._ops.call("portal_call", call)


class ChildInstances:
    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    async def create(
        self, actor: str, key: str | None = None, config: Mapping[str, Any] | None = None, *,
        filter: Mapping[str, Any] | None = None,  # noqa: A002
    ) -> dict[str, Any]:
        """Create (or find) an instance; its parent is the calling instance."""
        return await self._ops.call(
            "instances_create", params(actor=actor, key=key, config=config, filter=filter)
        )


class BaseContext:
    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.tenant = ops.tenant

    # Made on first use: most runs touch few of them.
    @cached_property
    def instances(self) -> ChildInstances:
        return ChildInstances(self.ops)

    @cached_property
    def conversations(self) -> Conversations:
        return Conversations(self.ops)

    def now(self) -> dt.datetime:
        """The current time by the runtime's clock (UTC): what schedules,
        retries and event times follow, and what a test's virtual clock
        moves (``time.time()`` stays the machine's)."""
        return dt.datetime.fromtimestamp(self.ops.now(), dt.timezone.utc)

    def random(self) -> float:
        """A random number in [0, 1), drawn from a seed the run keeps with
        its input: a fork replays the same draws (docs/advanced/forks.md),
        where ``random.random()`` would draw others."""
        return self.ops.random()

    async def append(self, event: Mapping[str, Any], stream: str = "/") -> dict[str, Any]:
        """Append to one of the tenant's streams (default: the global stream
        ``/``); returns ``{"offset", "id"}`` once durable."""
        return await self.ops.call("stream_append", {"event": event, "stream": stream})


class Context(BaseContext):
    """The context of one ``process()`` call."""

    def __init__(
        self, ops: Ops, instance: InstanceInfo, event: Event, attempt: int, queue_row: int | None = None
    ) -> None:
        super().__init__(ops)
        self.instance = instance
        self.event = event
        self.attempt = attempt
        self.queue_row = queue_row  # the queue row's id: the same on every retry (None: no row)

    def idempotency_key(self, name: str = "") -> str:
        """A key for a call to the outside world (a payment, an e-mail): the
        same on every retry and redrive of this event's queue row, different
        for every other row and ``name`` (docs/advanced/effects.md). Without a queue
        row there is no such key: InvalidInput (rather than one key shared
        by every row)."""
        if self.queue_row is None:
            raise errors.InvalidInput(
                "ctx.idempotency_key needs the run's queue row, and this context has none", field="queue_row"
            )
        return run_idempotency_key(self.tenant, self.instance.instance_id, self.queue_row, name)

    @cached_property
    def state(self) -> State:
        return State(self.ops)

    @cached_property
    def sqlite(self) -> Sqlite:
        return Sqlite(self.ops)

    @cached_property
    def schedules(self) -> Schedules:
        return Schedules(self.ops)

    @cached_property
    def portals(self) -> Portals:
        return Portals(self.ops)


class PortalContext(BaseContext):
    """The context of a portal request or loop."""

    def __init__(self, ops: Ops, portal: str) -> None:
        super().__init__(ops)
        self.portal = portal
