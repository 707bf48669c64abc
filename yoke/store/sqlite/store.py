"""Embedded backend: one SQLite file in WAL mode.

``SqliteStore`` is the assembly of its parts, one concern a module, each
built on the one ``SqliteDb`` (connection.py: the writer thread, the reader
threads, the group commit):

    appends.py          the steps of an append, in the writer's transaction
    streams.py          create, settings, delete, retention, info, gap evidence
    reads.py            pages of events, on the reader threads
    consumers.py        acknowledgements and the unread counters
    objects.py          large objects and the deletion outbox
    tokens.py           API tokens
    actors.py, subscriptions.py, durable_streams.py, outbox.py
                        the sub-stores of the contract (``store.actors``...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...clock import SYSTEM, Clock
from ...events import PreparedEvent
from ..durable_streams import Guard
from ..parts import ConcernParts
from ..results import (
    CommitResult,
    EphemeralCallback,
    WakeupCallback,
)
from .actors import SqliteActorStore
from .catalogue import SqliteCatalogue
from .appends import SqliteAppends
from .connection import SqliteDb, path_from_url
from .forks import SqliteForks
from .inputs import SqliteInputs
from .consumers import SqliteConsumers
from .durable_streams import SqliteProtocolStore
from .objects import SqliteObjects
from .outbox import SqliteOutboxStore
from .reads import SqliteReads
from .streams import SqliteStreams
from .subscriptions import SqliteSubscriptionStore
from .tokens import SqliteTokens


class SqliteStore(ConcernParts):
    """``contract.Store`` on SQLite."""

    # One process owns the file: its ephemeral events never leave it.
    relays_ephemeral = False

    def __init__(self, url: str, *, readers: int = 2, migrate: bool = True, clock: Clock = SYSTEM) -> None:
        self.path = path_from_url(url)
        db = self.db = SqliteDb(self.path, readers=readers, migrate=migrate, clock=clock)
        appends = self._appends = SqliteAppends(db)
        self._objects = SqliteObjects(db, appends)
        self._streams = SqliteStreams(db, appends, self._objects)
        self._reads = SqliteReads(db)
        self._consumers = SqliteConsumers(db, appends)
        self._tokens = SqliteTokens(db)

        self.actors = SqliteActorStore(db, appends)
        self.subscriptions = SqliteSubscriptionStore(db, appends)
        self.protocol = SqliteProtocolStore(db, appends)
        self.outbox = SqliteOutboxStore(db, appends)
        self.catalogue = SqliteCatalogue(db)
        self.inputs = SqliteInputs(db)
        self.forks = SqliteForks(db)

    async def start(
        self, on_wakeup: WakeupCallback, on_resync: Callable[[], None],
        on_ephemeral: EphemeralCallback | None = None, *,
        on_queue: Callable[[str], None] | None = None,
        on_subscription: Callable[[str], None] | None = None,
    ) -> None:
        # Appends by this process wake tails in-process; other processes on
        # the same file are seen by the tails' periodic sweep.
        await self.db.open()

    async def close(self) -> None:
        await self.db.close()
        await self.catalogue.close()

    async def ephemeral_barrier(self, timeout_s: float) -> bool:
        return True

    async def commit(
        self,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        guards: Sequence[Guard | None] | None = None,
    ) -> CommitResult:
        """In the writer's next group commit (connection.py), with the other
        commits waiting then: the steps of an append (appends.py), or of a
        guarded Durable Streams append (durable_streams.py)."""
        if guards is None:
            commit_in = self._appends.commit_in

            def job(conn):  # noqa: ANN001, ANN202
                return commit_in(conn, tenant, path, events, batch_of, now, new_stream_id)
        else:
            commit_guarded = self.protocol.commit_guarded

            def job(conn):  # noqa: ANN001, ANN202
                return commit_guarded(conn, tenant, path, events, batch_of, now, new_stream_id, guards)

        return await self.db.grouped(job, repeatable=True)

    # --- the rest of the contract: each method is its part's -----------------

    async def ready(self) -> None:
        return await self.db.ready()

    async def schema_version(self) -> int:
        return await self.db.schema_version()

    def pool_sizes(self) -> None:
        return None  # no pool: one writer thread and reader threads

    async def others_committed(self) -> bool:
        return await self.db.others_committed()
