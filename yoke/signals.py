"""Signals: what one component tells the others, without knowing them.

A component that changes something other components cache or wait on (an
actor's routing, a queue, the timers, a stream's existence, a subscription,
the deployed code) emits a signal; the components that care connect a
handler when they start and disconnect it when they stop. The emitter holds
no reference to its listeners' types, so neither imports the other, and a
component built alone (a test, a fork) simply has no listeners.

Invariant: ``emit`` calls every handler connected at that moment, in the
order they connected, before it returns. Handlers of a ``Signal`` must not
block (they set a flag or wake a task); an ``AsyncSignal``'s handlers are
awaited one after the other. A handler that raises stops the emit: that is
a bug of the handler, not a condition to survive.

Imports nothing of Yoke (like ``streams/wakeups.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Signal(Generic[P]):
    """Synchronous handlers: ``connect`` returns the call that disconnects."""

    __slots__ = ("name", "_handlers")

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[Callable[P, None]] = []

    def connect(self, handler: Callable[P, None]) -> Callable[[], None]:
        self._handlers.append(handler)
        return lambda: self.disconnect(handler)

    def disconnect(self, handler: Callable[P, None]) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for handler in tuple(self._handlers):
            handler(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._handlers)


class AsyncSignal(Generic[P]):
    """Handlers that are coroutines, awaited in turn by ``await emit(...)``."""

    __slots__ = ("name", "_handlers")

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[Callable[P, Awaitable[None]]] = []

    def connect(self, handler: Callable[P, Awaitable[None]]) -> Callable[[], None]:
        self._handlers.append(handler)
        return lambda: self.disconnect(handler)

    def disconnect(self, handler: Callable[P, Awaitable[None]]) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)

    async def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for handler in tuple(self._handlers):
            await handler(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._handlers)


@dataclass(frozen=True)
class Signals:
    """The signals of one runtime (one set per ``yoke.open``)."""

    # (tenant): an actor's instances or filters changed; fan-out rereads them.
    routing_changed: Signal[[str]] = field(default_factory=lambda: Signal("routing_changed"))
    # (tenant): rows were queued or released outside the fan-out; schedule now.
    queue_changed: Signal[[str]] = field(default_factory=lambda: Signal("queue_changed"))
    # (due_at ms, None for a cancel): a schedule was set or cancelled; the
    # timer loop looks at once, and again at that due time.
    timers_changed: Signal[[int | None]] = field(default_factory=lambda: Signal("timers_changed"))
    # (tenant, path): a stream was deleted; forget what was cached of it.
    stream_deleted: AsyncSignal[[str, str]] = field(default_factory=lambda: AsyncSignal("stream_deleted"))
    # (tenant, path, name): a subscription was created, changed or resumed.
    subscription_changed: Signal[[str, str, str]] = field(
        default_factory=lambda: Signal("subscription_changed")
    )
    # ('tenant|path', 'tenant' or ''): another process changed subscriptions
    # (of that source, of the tenant, or processes came or went).
    subscription_announced: Signal[[str]] = field(default_factory=lambda: Signal("subscription_announced"))
    # (): a subscription's cursor advanced in this process (its waiters look again).
    subscription_progressed: Signal[[]] = field(default_factory=lambda: Signal("subscription_progressed"))
    # (code version): --reload saw new application code.
    code_changed: Signal[[str]] = field(default_factory=lambda: Signal("code_changed"))
