"""Several server processes on one listening socket: ``yoke serve --workers N``.

The socket is bound once, before the fork, so every process accepts from
the same queue (the kernel hands each connection to one of them). Each
process opens a runtime of its own (its pool, group commit, tails and, with
an app, its executor) on the shared PostgreSQL database, which is where they
coordinate, as separate ``yoke serve`` processes would. The first process
announces the server and owns the admin token file; the others serve
quietly. When the first one is told to stop (SIGTERM, SIGINT), it tells
the others at once, and ends once they all have; a worker that dies is
not replaced (run the server under a supervisor that restarts it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("yoke.http.workers")


def serve_forked(count: int, serve_one: Callable[[bool, Callable[[], None] | None], None]) -> None:
    """Run ``serve_one(announce, on_stop)`` in ``count`` processes: this one
    (``announce=True``; ``on_stop`` passes its stop signal on to the
    workers at once, so they drain alongside it) and ``count - 1`` forked
    before anything else opens (no threads, loops or connections exist yet
    to be copied)."""
    children: list[int] = []
    first = os.getpid()
    for _ in range(count - 1):
        pid = os.fork()
        if pid == 0:  # a worker
            code = 1
            try:
                _die_with_parent()
                if os.getppid() != first:  # the first process ended before the line above
                    code = 0
                else:
                    serve_one(False, None)
                    code = 0
            except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: a stop
                code = 0
            except BaseException:
                log.exception("a server worker failed")
            finally:
                os._exit(code)
        children.append(pid)

    def stop_workers() -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # The server re-raises the signal that stopped it once it is done; hold
    # it until the workers have stopped too, then end the same way.
    caught: list[int] = []
    held = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve_one(True, stop_workers)
    finally:
        stop_workers()
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for s, handler in held.items():
            signal.signal(s, handler)
        for s in caught:
            signal.raise_signal(s)


def _die_with_parent() -> None:
    """SIGTERM this worker when the first process ends, however it ends
    (Linux; elsewhere a killed first process leaves its workers serving)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
