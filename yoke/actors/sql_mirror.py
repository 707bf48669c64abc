"""Keeps the SQL catalogue's mirror of instance tables current
(docs/advanced/sql.md).

The databases this process owns note their changed rows
(``actors/state_capture.py``); this sends them to the store's catalogue,
many instances in one transaction, as soon as the previous send is done
(a send in flight gathers the next batch, as the appender's group commit
does). An instance in a run is not sent until the run ends, so a query
sees all of a run's changes or none of them.

An instance's first send in a process is checked against the version the
mirror holds: a process that crashed between an instance's commit and its
send left the mirror behind, and the instance is then sent whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..store.catalogue import CatalogueStore, InstanceRows
from .state import InstanceDatabase, StateDatabases

log = logging.getLogger("yoke.actors.sql_mirror")

RETRY_S = (0.1, 0.5, 2.0, 5.0)  # after failed sends, one after another
MAX_REMEMBERED = 100_000  # instances whose last sent version this process remembers
SEND_ROWS = 5_000  # rows a send writes in one transaction, about


class SqlMirror:
    def __init__(self, databases: StateDatabases, catalogue: Callable[[], CatalogueStore]) -> None:
        self._databases = databases
        self._catalogue = catalogue
        self._dirty: dict[tuple[str, str], InstanceDatabase] = {}
        self._whole: set[tuple[str, str]] = set()  # to send whole next
        self._sent: dict[tuple[str, str], int] = {}  # the version this process last sent
        self._wake = asyncio.Event()
        self._sending = False
        self._turns: list[asyncio.Future[None]] = []  # settled() callers, answered after the next turn
        self._task: asyncio.Task[None] | None = None
        self.failures = 0  # sends that failed in a row

    def start(self) -> None:
        self._databases.mirror_to(self._changed)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="yoke-sql-mirror")

    async def stop(self) -> None:
        """Send what is ready, then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), 5.0)
        except Exception:  # (the next process's first look repairs it)
            log.warning("the SQL mirror's last send failed", exc_info=True)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        for turn in self._turns:
            if not turn.done():
                turn.set_result(None)

    def _changed(self, db: InstanceDatabase) -> None:
        self._dirty[(db.tenant, db.instance_id)] = db
        self._wake.set()

    async def settled(self) -> None:
        """Until everything noted so far is sent, but for runs under way
        (tests, ``yoke.testing``)."""
        await asyncio.sleep(0)  # notices from this loop's operations arrive
        await self._databases.reads_done()  # what runs that ended left to read
        while self._task is not None and not self._task.done():
            # Ready: an instance not in a run, or one whose earlier run's end left rows stashed.
            ready = any(
                not self._databases.held(db) or (db.capture is not None and db.capture.stash is not None)
                for db in self._dirty.values()
            )
            if not ready and not self._sending:
                return
            turn = asyncio.get_running_loop().create_future()
            self._turns.append(turn)
            if ready:
                self._wake.set()
            await turn

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._sending = True
            try:
                await self.flush()
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                log.warning("sending changed rows to the SQL mirror failed; retrying", exc_info=True)
                await asyncio.sleep(RETRY_S[min(self.failures, len(RETRY_S)) - 1])
                self._wake.set()
            finally:
                self._sending = False
                turns, self._turns = self._turns, []
                for turn in turns:
                    if not turn.done():
                        turn.set_result(None)

    async def flush(self) -> None:
        """Send what every instance with changes has ready."""
        ready = list(self._dirty.items())  # (one in a run sends what an earlier run's end stashed)
        if not ready:
            return
        for key, _ in ready:
            del self._dirty[key]
        tenants: dict[str, list[InstanceDatabase]] = {}
        for (tenant, _), db in ready:
            tenants.setdefault(tenant, []).append(db)
        failed: BaseException | None = None
        for tenant, dbs in tenants.items():
            try:
                await self._send(tenant, dbs)
            except Exception as exc:
                failed = exc
                for db in dbs:  # their notes are stashed: sent with the next try
                    self._dirty.setdefault((db.tenant, db.instance_id), db)
        if failed is not None:
            raise failed

    async def _send(self, tenant: str, dbs: list[InstanceDatabase]) -> None:
        catalogue = self._catalogue()
        opened = [db for db in dbs if db.capture is not None and db.capture.opened]
        unknown = [db for db in opened if self._sent.get((tenant, db.instance_id)) != db.capture.version_at_open]
        held = await catalogue.mirrored(tenant, [db.instance_id for db in unknown]) if unknown else {}
        changes: list[tuple[InstanceDatabase, InstanceRows]] = []
        for db in dbs:
            capture = db.capture
            if capture is None:
                continue
            key = (tenant, db.instance_id)
            whole = key in self._whole
            if capture.opened:
                capture.opened = False
                if db in unknown and held.get(db.instance_id) != capture.version_at_open:
                    whole = True
                elif not whole:
                    capture.mirror_current()
            if self._databases.held(db):  # in a run: what an earlier run's end stashed, the rest after it
                capture.resend_whole = capture.resend_whole or whole
                self._whole.discard(key)
                self._dirty[key] = db
                stashed = capture.collect(None, whole=False)
                if stashed is not None:
                    changes.append((db, stashed))
                continue
            if whole and capture.stash is not None and capture.stash.whole and not (capture.noted or capture.wrote):
                whole = False  # read whole at its run's end already
            try:
                rows, complete = await db.mirror_changes(whole=whole, unless=lambda db=db: self._databases.held(db))
            except Exception:
                log.warning("reading instance %s's changed rows failed", db.instance_id, exc_info=True)
                self._whole.add(key)  # its notes may be lost: whole next time
                self._dirty[key] = db
                asyncio.get_running_loop().call_later(RETRY_S[0], self._wake.set)
                continue
            self._whole.discard(key)  # (a whole send put off is the capture's own to do now)
            if not complete:  # a run is under way: the rest when it ends (release)
                self._dirty[key] = db
            if rows is not None:
                changes.append((db, rows))
        chunks = _chunks(changes)
        for i, chunk in enumerate(chunks):
            try:
                again = await catalogue.mirror(tenant, [rows for _, rows in chunk])
            except BaseException:
                for db, rows in [c for later in chunks[i:] for c in later]:  # back in front of what came since
                    capture = db.capture
                    assert capture is not None
                    capture.stash = rows if capture.stash is None else rows.merge(capture.stash)
                raise
            for db, rows in chunk:
                key = (tenant, db.instance_id)
                if db.instance_id in again:
                    self._whole.add(key)
                    self._dirty[key] = db
                    self._wake.set()
                else:
                    self._sent[key] = rows.version
                    if len(self._sent) > MAX_REMEMBERED:  # the oldest go (a miss costs one lookup)
                        del self._sent[next(iter(self._sent))]


def _chunks(changes: list[tuple[InstanceDatabase, InstanceRows]]) -> list[list[tuple[InstanceDatabase, InstanceRows]]]:
    """The changes in transactions of at most about SEND_ROWS rows (a load of
    thousands of instances in one transaction ran past the database's
    statement time, and each retry sent more)."""
    chunks: list[list[tuple[InstanceDatabase, InstanceRows]]] = [[]]
    rows = 0
    for change in changes:
        size = sum(len(t.upserts) + len(t.deletes) + 1 for t in change[1].tables.values()) + 1
        if chunks[-1] and rows + size > SEND_ROWS:
            chunks.append([])
            rows = 0
        chunks[-1].append(change)
        rows += size
    return [c for c in chunks if c]
