"""Database faults at the store boundary, for both backends.

A lost or refused database connection (PostgreSQL), or a database file that
cannot be used right now (SQLite: still locked when the busy timeout ran
out, an I/O error, a full disk), reaches callers as ``errors.Unavailable``:
code ``unavailable``, HTTP 503 with ``Retry-After``. A real SQL error (a
constraint, a syntax error, a type mismatch) is not translated: it is a bug
and surfaces as one.

Nothing here decides whether a call may be repeated; each caller does:

- read-only store methods are wrapped in ``retry_reads`` and try again by
  themselves for a few seconds before answering ``unavailable``;
- a write is never repeated blindly: its outcome is unknown once the
  connection was lost after the statement left (the commit may have
  happened). The appender repeats a group commit for the callers whose
  every event carries an idempotency key (a repeat then returns the original
  offsets), and for every caller when the failure says nothing was written
  (``NOTHING_WRITTEN``); the backends repeat a statement only when it
  provably never reached the database (see ``postgres/store.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from .. import errors, metrics

log = logging.getLogger("yoke.store.faults")

P = ParamSpec("P")
T = TypeVar("T")

# What a 503 tells the client to wait before trying again (seconds).
RETRY_AFTER_S = 1
# How long a read keeps trying before it answers ``unavailable``.
READ_RETRY_S = 3.0
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


# Reasons that say the call wrote nothing: no connection could be opened, or
# the server rolled the statement's transaction back (a cancel, a deadlock, a
# serialization failure, a lock not available), or the server refused to
# write at all (read_only: a standby after a failover). Such a call may be
# made again as it was, even an append without an idempotency key; after any
# other reason (connection_lost above all) a write's outcome is unknown.
NOTHING_WRITTEN = frozenset({"connect_failed", "cancelled", "conflict", "read_only"})


def unavailable(message: str, reason: str) -> errors.Unavailable:
    """The error callers see; ``reason`` says which fault it was
    (connection_lost, connect_failed, cancelled, conflict, read_only, database_locked,
    io_error, disk_full), and yoke_database_errors_total counts it."""
    metrics.DATABASE_ERRORS.labels(reason).inc()
    return errors.Unavailable(message, reason=reason, retry_after=RETRY_AFTER_S)


def nothing_written(exc: errors.Unavailable) -> bool:
    """Whether the failed call provably wrote nothing (``NOTHING_WRITTEN``)."""
    return exc.details.get("reason") in NOTHING_WRITTEN


def log_retried(logger: logging.Logger, message: str, *args: object) -> None:
    """From an ``except`` block of a background pass that will run again: a
    database fault (``Unavailable``) is expected, one warning line with its
    message; anything else is a bug, logged with its traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, errors.Unavailable):
        logger.warning(message + ": %s", *args, exc.message)
    else:
        logger.exception(message, *args)


class Backoff:
    """Doubling delays from ``FIRST_BACKOFF_S`` up to ``MAX_BACKOFF_S``,
    within a total budget of ``budget_s`` seconds."""

    def __init__(self, budget_s: float) -> None:
        self._budget_s = budget_s
        self._deadline: float | None = None
        self._delay = FIRST_BACKOFF_S

    async def wait(self) -> bool:
        """Sleep before the next attempt; False (at once) when the budget is spent."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._budget_s
        delay = min(self._delay, self._deadline - loop.time())
        if delay <= 0:
            return False
        await asyncio.sleep(delay)
        self._delay = min(self._delay * 2, MAX_BACKOFF_S)
        return True


def retry_reads(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """For a read-only store method: on ``Unavailable``, try again with
    backoff for up to ``READ_RETRY_S`` seconds. Safe because it changes nothing."""

    @functools.wraps(method)
    async def retrying(*args: P.args, **kwargs: P.kwargs) -> T:
        backoff = Backoff(READ_RETRY_S)
        while True:
            try:
                return await method(*args, **kwargs)
            except errors.Unavailable as exc:
                if not await backoff.wait():
                    raise
                log.info("%s: %s; retrying", method.__qualname__, exc.message)

    return retrying
