"""The actor kernel: what the actor machinery is built from.

The runtime (the composition root) builds one ``ActorKernel`` and hands it
to the executor, to ``Instances`` and to the op handlers; they reach the
store, the streams and the other components only through it, never through
the runtime. Everything in it is either a value or a narrow callable, so a
component can be built with some of it swapped (a sandbox store, a clock
that a test moves).

- ``actors()``: the actor store; raises ``RuntimeClosed`` once the runtime
  closed (the closed gate stays exact however a component was built).
- ``inputs()``, ``forks()``: the instances' kept inputs and their forks
  (store/inputs.py, store/forks.py), as ``actors()``.
- ``read(tenant, path, after, limit)``: a page of a stream's durable events
  (fan-out).
- ``stream(path, tenant, *, caller=...)``: the ``Stream`` handle at a path;
  actors append through it (its rules, group commit), never build one.
- ``appended(tenant, path, count)``: announce events that a store
  transaction of the actors wrote (atomic runs, conversation posts), as the
  appender does after its own commits.
- ``hub``: the wake-up hub (tails of ``/`` hear of instance facts; the
  fan-out observes appends).
- ``signals``: routing, queue, timers, stream deleted, code changed.
- ``state_databases()``: this process's per-instance SQLite databases
  (opened on first use); ``state_home``: the guard that checks where they
  live before one is read.
- ``tracing``: where run attempts' spans go (``tracing.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..clock import SYSTEM, Clock, wall_ms
from ..signals import Signals
from ..tracing import Tracing

if TYPE_CHECKING:
    from ..config import Settings
    from ..routing.evaluation import Evaluations
    from ..store.actors import ActorStore
    from ..store.forks import ForkStore
    from ..store.inputs import InputStore
    from ..store.contract import ReadPage
    from ..streams.stream import Stream
    from ..streams.rules import Caller
    from ..streams.wakeups import WakeupHub
    from .state import StateDatabases
    from .state_home import Guard


class OpenStream(Protocol):
    def __call__(self, path: str, tenant: str = ..., *, caller: Caller = ...) -> Stream: ...


@dataclass(frozen=True)
class ActorSettings:
    """The settings values the actor machinery reads (config.py documents them)."""

    max_event_bytes: int = 64 * 1024
    isolation: str = "inprocess"
    host_processes: int = 4
    host_runs: int = 1
    host_memory_mb: int = 0
    max_in_flight: int = 256
    claim_shards: int = 2
    scheduler_sweep_s: float = 1.0
    schedule_poll_s: float = 1.0
    worker_heartbeat_s: float = 1.0
    worker_stale_s: float = 10.0
    deploy_version: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> ActorSettings:
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ActorKernel:
    actors: Callable[[], ActorStore]
    inputs: Callable[[], InputStore]
    forks: Callable[[], ForkStore]
    read: Callable[[str, str, int, int], Awaitable[ReadPage]]
    stream: OpenStream
    appended: Callable[[str, str, int], None]
    hub: WakeupHub
    signals: Signals
    evaluations: Evaluations
    state_databases: Callable[[], StateDatabases]
    state_home: Guard
    settings: ActorSettings
    clock: Clock = SYSTEM
    tracing: Tracing = Tracing()  # run attempts' spans (off unless a provider is installed)

    def now_ms(self) -> int:
        """The clock's wall time in milliseconds, as the store keeps it."""
        return wall_ms(self.clock)
