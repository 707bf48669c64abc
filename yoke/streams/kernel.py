"""The stream kernel: what every ``Stream`` handle of one runtime shares.

The composition root (``runtime.py``) builds these services once and puts
them in one frozen record; a handle is ``Stream(kernel, path, tenant,
caller=...)``. The record holds no runtime: a component built from it (a
test, a fork) reaches exactly these services and nothing more. ``store`` is
the accessor (``store.OpenStore``): called at each use, it raises
``RuntimeClosed`` once the runtime has closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..clock import SYSTEM, Clock, wall_ms
from ..routing.evaluation import Evaluations
from ..signals import Signals
from ..store import OpenStore
from .append import AppendService
from .connections import Connections
from .ephemeral import EphemeralBuffers
from .gaps import Gaps
from .inputs import InputDispatcher
from .relay import EphemeralRelay
from .tail import SharedReads
from .wakeups import WakeupHub


@dataclass(frozen=True, eq=False)
class StreamKernel:
    store: OpenStore
    hub: WakeupHub
    buffers: EphemeralBuffers
    relay: EphemeralRelay
    appends: AppendService
    shared_reads: SharedReads
    evaluations: Evaluations
    gaps: Gaps
    inputs: InputDispatcher
    connections: Connections
    signals: Signals
    closed: Callable[[], bool]  # the runtime has shut down: tails and connections end
    max_event_bytes: int
    tail_sweep_s: float
    clock: Clock = SYSTEM  # the runtime's: what handles stamp (creations, acks, inputs)

    def now_ms(self) -> int:
        """The clock's wall time in milliseconds, as the store keeps it."""
        return wall_ms(self.clock)
