"""Several server processes on one listening socket: ``yoke serve --workers N``.

The socket is bound once, before the fork, so every process accepts from
the same queue (the kernel hands each connection to one of them). Each
process opens a runtime of its own (its pool, group commit, tails and, with
an app, its executor) on the shared PostgreSQL database, which is where they
coordinate, as separate ``yoke serve`` processes would. The first process
announces the server and owns the admin token file; the others serve
quietly. When the first one stops (SIGTERM, SIGINT), it stops the others
and waits for them; a worker that dies is not replaced (run the server
under a supervisor that restarts it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("yoke.http.workers")


def serve_forked(count: int, serve_one: Callable[[bool], None]) -> None:
    """Run ``serve_one(announce)`` in ``count`` processes: this one
    (``announce=True``) and ``count - 1`` forked before anything else opens
    (no threads, loops or connections exist yet to be copied)."""
    children: list[int] = []
    for _ in range(count - 1):
        pid = os.fork()
        if pid == 0:  # a worker
            code = 1
            try:
                _die_with_parent()
                serve_one(False)
                code = 0
            except BaseException:
                log.exception("a server worker failed")
            finally:
                os._exit(code)
        children.append(pid)
    # The server re-raises the signal that stopped it once it is done; hold
    # it until the workers have stopped too, then end the same way.
    caught: list[int] = []
    held = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve_one(True)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
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
