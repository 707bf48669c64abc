"""Actor instances of one tenant: create, look up, list, and their queues
(depth, dead letters, redrive, drop). ``y.instances(tenant)`` returns this
handle; the HTTP API and the CLI use the same methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from .. import errors
from ..events import check_text, json_text, validate_tenant
from ..lifecycle import GLOBAL
from ..routing.filters import Filter
from ..routing.index import MAX_KEY_CHARS, SINGLETON_KEY
from ..store.actors import Effect, InstanceInfo, QueueDepth, QueueRow, Schedule, new_instance_id
from ..store.inputs import InputPage
from .state import InstanceDatabase, QueryResult, check_query

if TYPE_CHECKING:
    from .app import App
    from .kernel import ActorKernel

MAX_QID = 2**63 - 1
MAX_QIDS = 10_000  # queue row ids one redrive or drop names

T = TypeVar("T")


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
        raise errors.InvalidInput(f"an instance key is 1-{MAX_KEY_CHARS} characters", field="key")
    return check_text(key, "key", errors.InvalidInput)


def check_name(value: Any, field: str, max_chars: int = 200) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars:
        raise errors.InvalidInput(f"{field} must be 1-{max_chars} characters", field=field)
    return check_text(value, field, errors.InvalidInput)


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise errors.InvalidInput("limit must be 1-1000", field="limit")
    return limit


class Instances:
    """``app``: the application whose actors' definitions (singleton, keyed,
    filters) apply; ``worker_id``: this process's executor, which new
    instances go to (None: none runs here, they wait to be adopted);
    ``forks``: makes the tenant's forks for this handle."""

    def __init__(
        self, kernel: ActorKernel, tenant: str, *, app: App | None = None, worker_id: str | None = None,
        forks: Callable[[Instances], Any] | None = None,
    ) -> None:
        validate_tenant(tenant)
        self._kernel = kernel
        self._app = app
        self._worker_id = worker_id
        self._forks = forks  # makes this tenant's Forks (the runtime's; None: no forks from here)
        self.tenant = tenant

    @property
    def _store(self):  # noqa: ANN202
        return self._kernel.actors()

    async def create(
        self,
        actor: str,
        key: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        parent_id: str | None = None,
        effect: Effect | None = None,
    ) -> InstanceInfo:
        """Create the instance ``(actor, key)``, or return the existing one.

        With an application loaded, the actor must be registered and the
        instance's filter is ``filter`` (when given), else the actor's
        ``filter_from_config(config)``, else the actor's filter; keyed actors
        route by key instead. A singleton actor has one instance per tenant.
        """
        info, _ = await self.create_or_get(
            actor, key, config, filter=filter, parent_id=parent_id, effect=effect
        )
        return info

    async def create_or_get(
        self,
        actor: str,
        key: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        parent_id: str | None = None,
        effect: Effect | None = None,
    ) -> tuple[InstanceInfo, bool]:
        """``create``, also telling whether this call created the instance.
        ``effect``: the call is a journaled effect of an actor run (journal.py)."""
        info, created = await self._store.create_instance(
            self.new_instance(actor, key, config, filter=filter, parent_id=parent_id), effect
        )
        if created:
            self._kernel.signals.routing_changed.emit(self.tenant)
            self._kernel.hub.wake(self.tenant, GLOBAL)  # its yoke.instance.created fact
        return info, created

    def new_instance(
        self,
        actor: str,
        key: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        parent_id: str | None = None,
    ) -> InstanceInfo:
        """The instance ``create`` would insert, checked (not stored)."""
        app = self._app
        if config is not None and not isinstance(config, Mapping):
            raise errors.InvalidInput("config must be an object", field="config")
        config = dict(config or {})
        json_text(config, "config")  # must be storable JSON
        check_name(actor, "actor")
        definition = app.get(actor) if app is not None else None
        if definition is not None and definition.singleton:
            key = SINGLETON_KEY
        key = check_key(key if key is not None else new_instance_id())
        if filter is not None and definition is not None and definition.keyed:
            # Its events come through the actor's key route: a filter of its
            # own would deliver them a second time.
            raise errors.InvalidFilter(
                f"actor {actor!r} routes by key (keyed or singleton): its instances take no filter",
                field="filter",
            )
        if filter is not None:
            resolved: Filter | None = Filter.from_dict(filter)
        elif definition is not None:
            try:
                resolved = definition.instance_filter(config)
            except errors.YokeError:
                raise
            except Exception as exc:  # the application's filter_from_config failed on this config
                raise errors.InvalidInput(
                    f"actor {actor!r} cannot derive a filter from this config: {type(exc).__name__}: {exc}",
                    field="config",
                ) from None
        else:
            resolved = None
        if resolved is not None and resolved.key is not None:
            raise errors.InvalidFilter("an instance filter has no routing key", field="key")
        return InstanceInfo(
            instance_id=new_instance_id(),
            tenant=self.tenant,
            actor=actor,
            key=key,
            config=orjson.loads(orjson.dumps(config)),
            filter=None if resolved is None else resolved.to_dict(),
            parent_id=parent_id,
            worker_id=self._worker_id,
            created_at=self._kernel.now_ms(),
        )

    async def remove(self, instance_id: str) -> InstanceInfo:
        """Delete the instance, its queue rows (dead letters included),
        schedules and stored state; ``yoke.instance.removed`` is appended
        to ``/`` in the same transaction. A keyed instance is created again
        by the next event routed to its key. Its local state file (file
        storage) is removed by this process only."""
        check_name(instance_id, "instance_id", 10_000)
        info = await self._store.remove_instance(self.tenant, instance_id)
        if info is None:
            raise errors.InstanceNotFound(instance_id=instance_id)
        self._kernel.state_databases().remove(self.tenant, instance_id)
        self._kernel.signals.routing_changed.emit(self.tenant)
        self._kernel.hub.wake(self.tenant, GLOBAL)
        return info

    async def get(self, instance_id: str) -> InstanceInfo:
        check_name(instance_id, "instance_id", 10_000)
        info = await self._store.get_instance(self.tenant, instance_id)
        if info is None:
            raise errors.InstanceNotFound(instance_id=instance_id)
        return info

    async def find(self, actor: str, key: str) -> InstanceInfo | None:
        return await self._store.find_instance(self.tenant, check_name(actor, "actor"), check_key(key))

    async def list(
        self, actor: str | None = None, *, limit: int = 100, after: str | None = None
    ) -> list[InstanceInfo]:
        check_limit(limit)
        if actor is not None:
            check_name(actor, "actor")
        if after is not None:
            check_name(after, "after", 10_000)
        return await self._store.list_instances(self.tenant, actor, limit, after)

    async def state(self, instance_id: str) -> tuple[Any, int]:
        """The instance's ``ctx.state`` document and version (operators, tests)."""
        return await self._on_database(instance_id, lambda db: db.state_get())

    async def query(
        self, instance_id: str, sql: str, params: Sequence[Any] = (), *,
        max_rows: int = 500, timeout_s: float = 2.0,
    ) -> QueryResult:
        """One read-only SQL statement on the instance's SQLite database (its
        ``ctx.sqlite`` tables and ``_yoke_state``): at most ``max_rows`` rows
        (1-10000) and ``timeout_s`` seconds (0-30). Anything that would write,
        attach or set a pragma is refused (invalid_input)."""
        check_query(params, max_rows, timeout_s)
        return await self._on_database(
            instance_id, lambda db: db.read_only(sql, params, max_rows=max_rows, timeout_s=float(timeout_s))
        )

    async def image(self, instance_id: str) -> bytes:
        """The instance's database as one serialized image (a fork's diff)."""
        return await self._on_database(instance_id, lambda db: db.image())

    def forks(self) -> Any:
        """The tenant's forks (actors/forks.py, docs/advanced/forks.md), as
        the runtime makes them for this handle."""
        if self._forks is None:
            raise errors.InvalidInput("this handle of the instances makes no forks")
        return self._forks(self)

    async def fork(
        self, instance_id: str, upto: int | None = None, app: App | str | None = None,
        edits: Sequence[dict[str, Any]] | None = None,
    ) -> Any:
        """A sandboxed replay of the instance's inputs 1..``upto`` (all:
        None) under ``app`` (default: this runtime's application), with
        ``edits``: its handle (docs/advanced/forks.md)."""
        return await self.forks().create(instance_id, upto=upto, app=app, edits=edits)

    async def _on_database(self, instance_id: str, work: Callable[[InstanceDatabase], Awaitable[T]]) -> T:
        """``work`` on the instance's database. The process that runs the
        instance keeps it open and is its only writer, so its copy is current;
        any other process (an API server without an executor, a worker that
        does not own it) reads the stored copy afresh instead of caching one
        that would go stale."""
        info = await self.get(instance_id)
        await self._kernel.state_home.check()  # never an empty database where the state is not
        databases = self._kernel.state_databases()
        if self._worker_id is not None and info.worker_id == self._worker_id:
            db = databases.get(self.tenant, instance_id)
            async with db.run_lock:  # not inside an atomic run's open transaction
                return await work(db)
        db = InstanceDatabase(databases, self.tenant, instance_id)
        try:
            return await work(db)
        finally:
            db.close()

    async def schedules(self, instance_id: str) -> list[Schedule]:
        """The instance's schedules (timers and cron), by name."""
        await self.get(instance_id)
        return sorted(await self._store.schedules(self.tenant, instance_id), key=lambda s: s.name)

    async def depth(self, instance_id: str | None = None) -> QueueDepth:
        if instance_id is not None:
            await self.get(instance_id)
        return await self._store.queue_depth(self.tenant, instance_id)

    async def queue(self, instance_id: str, *, status: str | None = None, limit: int = 100) -> list[QueueRow]:
        if status not in (None, "pending", "processing", "dead"):
            raise errors.InvalidInput("status is pending, processing or dead", field="status")
        check_limit(limit)
        await self.get(instance_id)
        return await self._store.queue_rows(self.tenant, instance_id, status, limit)

    async def dead(self, instance_id: str, *, limit: int = 100) -> list[QueueRow]:
        return await self.queue(instance_id, status="dead", limit=limit)

    async def redrive(self, instance_id: str, qids: Sequence[int] | None = None) -> int:
        """Dead rows (all, or those listed) back to pending with attempts reset."""
        await self.get(instance_id)
        chosen = _qids(qids)
        tracing = self._kernel.tracing
        if not tracing.on:
            count = await self._store.redrive(self.tenant, instance_id, chosen, self._kernel.now_ms())
        else:  # the rows' next attempts are children of this span, linked to their events' traces
            with tracing.replaying(self.tenant, "redrive", instance_id=instance_id) as replayed_in:
                count = await self._store.redrive(self.tenant, instance_id, chosen, self._kernel.now_ms(), replayed_in)
        self._kernel.signals.queue_changed.emit(self.tenant)
        return count

    async def inputs(
        self, instance_id: str, *, after: int = 0, upto: int | None = None, limit: int = 100,
    ) -> InputPage:
        """The instance's kept inputs (docs/advanced/forks.md), oldest first:
        a page of up to ``limit`` with ``after < seq <= upto``, and the seq
        the next page begins after (None: this was the last)."""
        check_limit(limit)
        for field, value in (("after", after), ("upto", upto)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QID):
                raise errors.InvalidInput(f"{field} must be an input number (0 or more)", field=field)
        await self.get(instance_id)
        return await self._kernel.inputs().inputs(self.tenant, instance_id, after=after, upto=upto, limit=limit)

    async def drop(self, instance_id: str, qids: Sequence[int] | None = None) -> int:
        """Delete dead rows (all, or those listed)."""
        await self.get(instance_id)
        return await self._store.drop_dead(self.tenant, instance_id, _qids(qids))


def _qids(qids: Sequence[int] | None) -> list[int] | None:
    if qids is None:
        return None
    if isinstance(qids, (str, bytes)) or not isinstance(qids, Sequence) or len(qids) > MAX_QIDS or not all(
        isinstance(q, int) and not isinstance(q, bool) and 1 <= q <= MAX_QID for q in qids
    ):
        raise errors.InvalidInput(
            f"qids must be a list of at most {MAX_QIDS} queue row ids", field="qids"
        )
    return list(qids)
