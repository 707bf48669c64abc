"""The Runtime: assembles the store and the stream services.

``yoke.open(url)`` is the entry point::

    async with yoke.open("sqlite:///./.yoke/yoke.db") as y:
        await y.stream("/orders").append({"type": "order.placed"})
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from . import errors, metrics
from .applications import load
from .actors.app import App, app_spec, per_actor_retry, with_retry_settings
from .actors.forks import Forks, load_named
from .actors.deploy_check import check_deploy
from .actors.executor import Executor
from .actors.instances import Instances
from .actors.kernel import ActorKernel, ActorSettings
from .failures import Failures, FailureServices
from .actors.sql_mirror import SqlMirror
from .actors.state import StateDatabases, make_storage, max_open_databases
from .catalogue import SqlCatalogue
from .actors.state_home import Guard as StateHomeGuard
from .clock import SYSTEM, Clock, wall_ms
from .config import Settings
from .events import MAX_PATH_CHARS, validate_path, validate_tenant
from .hosts.reload import CodeWatch
from .sampling import Sampler
from .signals import Signals
from .routing.evaluation import Evaluations
from .store import Store, StreamInfo, connect_store
from .store.catalogue import CatalogueTable, QueryResult
from .streams.append import AppendService
from .streams.connections import Connections
from .streams.ephemeral import EphemeralBuffers
from .streams.stream import Stream
from .streams.gaps import Gaps
from .streams.inputs import InputDispatcher
from .streams.kernel import StreamKernel
from .streams.protocol_streams import ProtocolStreams
from .streams.relay import EphemeralRelay
from .streams.rules import APPLICATION, Caller
from .streams.retention import prune_forever, prune_once
from .streams.tail import SharedReads
from .streams.wakeups import WakeupHub
from .store.faults import log_retried
from .subscriptions.copies import Copying
from .subscriptions.declared import Reconciled, reconcile, webhook_secrets
from .subscriptions.deliveries import Deliveries, DeliverySettings
from .subscriptions.management import lag_report, rebuild_stale_catalogues
from .tokens import Tokens
from .tracing import Tracing

log = logging.getLogger("yoke.runtime")


class Runtime:
    def __init__(
        self, settings: Settings, app: App | None = None, *, executor: bool = True, clock: Clock = SYSTEM,
        tracer_provider: Any = None,
    ) -> None:
        self.settings = settings
        # Where spans go (tracing.py): this provider, else the global one
        # once the application installs one; off (free) without either.
        self.tracing = Tracing(tracer_provider)
        # The actors' retries as this deployment sets them (decorator arguments win).
        self.app = app if app is None else with_retry_settings(app, {
            "max_attempts": settings.actor_max_attempts, "retry_base_s": settings.actor_retry_base_s,
            "retry_max_s": settings.actor_retry_max_s,
        }, per_actor_retry(settings.actor_retry))
        # The one clock every component and the store take the time from
        # (clock.py): a test or a virtual-time run hands in its own.
        self.clock = clock
        # An app that registers only subscription receivers needs no fan-out,
        # scheduler or membership (they would cost every append a fan-out pass).
        self._want_executor = executor and app is not None and bool(app.actors or app.portals)
        self._want_deliveries = executor  # copies and webhooks need no app
        self.executor: Executor | None = None
        self.deliveries: Deliveries | None = None
        # --reload: the application's code, watched (hosts/reload.py).
        self.code: CodeWatch | None = None
        if settings.reload and app is not None:
            self.code = CodeWatch(
                app_spec(app), [d.script for d in app.actors.values() if d.script], definitions=app.definitions(),
                inprocess=[n for n, d in app.actors.items()
                           if d.language == "python" and (d.isolation or settings.isolation) != "process"],
            )
        self.catalogues: asyncio.Task[list[tuple[str, str]]] | None = None  # the check on open
        # What starting did to the subscriptions the app declares (app.subscription).
        self.subscriptions_reconciled: list[Reconciled] = []
        self._state_dbs: StateDatabases | None = None
        self._sql_mirror: SqlMirror | None = None  # started with the state databases
        self._store: Store = connect_store(settings, clock)
        # Where the instances' state lives: claimed by an executor at start,
        # checked before a read of an instance's state (actors/state_home.py).
        self.state_home = StateHomeGuard(self._store.actors, settings)
        self.signals = Signals()
        self.hub = WakeupHub()
        self.buffers = EphemeralBuffers.from_settings(settings)
        self.relay = EphemeralRelay(self.buffers, self.hub)
        self.relay.store = self._store
        self.shared_reads = SharedReads(self.hub)
        self.evaluations = Evaluations(settings.filter_processes, clock)
        open_store = self._open_store
        self.connections = Connections(
            open_store, self.hub, lambda tenant: self.stream("/", tenant),
            tail_sweep_s=settings.tail_sweep_s, closed=lambda: self.closed, clock=clock,
        )
        self.appends = AppendService(
            self._store, self.hub, self.buffers, max_group_events=settings.max_group_events, clock=clock,
            tracing=self.tracing,
        )
        # What the actor machinery is built from (actors/kernel.py).
        self.actor_kernel = ActorKernel(
            actors=lambda: self.store.actors,
            inputs=lambda: self.store.inputs,
            forks=lambda: self.store.forks,
            read=lambda tenant, path, after, limit: self.store.read(tenant, path, after, limit),
            stream=self.stream, appended=self.appends.appended, hub=self.hub, signals=self.signals,
            evaluations=self.evaluations, state_databases=self.state_databases, state_home=self.state_home,
            settings=ActorSettings.from_settings(settings), clock=clock, tracing=self.tracing,
        )
        self.protocol_streams = ProtocolStreams(lambda: self.store.protocol, self.hub, self.stream, clock)
        self.tokens = Tokens(self._store, clock)
        self.inputs = InputDispatcher(
            open_store, self.appends, max_event_bytes=settings.max_event_bytes, clock=clock
        )
        self.gaps = Gaps(open_store, clock)
        self.kernel = StreamKernel(
            open_store, self.hub, self.buffers, self.relay, self.appends, self.shared_reads, self.evaluations,
            self.gaps, self.inputs, self.connections, self.signals, closed=lambda: self.closed,
            max_event_bytes=settings.max_event_bytes, tail_sweep_s=settings.tail_sweep_s, clock=clock,
        )
        self._failure_services = FailureServices(
            open_store, self.appends, self.signals, self.evaluations,
            Copying(open_store, self.appends, self.stream, settings.max_event_bytes, clock),
            receivers=app.receivers if app is not None else {},
            http=lambda: None if self.deliveries is None else self.deliveries.http,
            max_event_bytes=settings.max_event_bytes, subscription_timeout_s=settings.subscription_timeout_s,
            clock=clock, tracing=self.tracing, forks=self.forks,
        )
        self.sql_catalogue = SqlCatalogue(
            open_store, self.failures, max_rows=settings.sql_max_rows, timeout_s=settings.sql_timeout_s
        )
        self._disconnect: list[Any] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False

    @property
    def store(self) -> Store:
        """The storage backend; ``RuntimeClosed`` once the runtime is shut down."""
        return self._open_store()

    def _open_store(self) -> Store:
        """The components' ``OpenStore`` (the closed gate: ``RuntimeClosed``)."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return self._store

    @property
    def closed(self) -> bool:
        return not self._started

    async def start(self) -> None:
        await self._store.start(
            on_wakeup=self.hub.wake, on_resync=self.hub.resync, on_ephemeral=self.relay.receive,
            on_queue=self.signals.queue_changed.emit, on_subscription=self.signals.subscription_announced.emit,
        )
        self._started = True
        # What a deleted stream leaves in this process goes, in this order:
        # its buffered ephemeral events, the fan-out's cursor (connected by the
        # executor as it starts), the runners of its subscriptions (connected
        # by the deliveries as they start); then its tails wake, read and end.
        self._disconnect = [self.signals.stream_deleted.connect(self.relay.stream_deleted)]
        if self._want_executor:
            assert self.app is not None
            try:
                # Refused when the instances' state lives elsewhere; constructing
                # the executor checks the app (hosts' scripts, isolation). A
                # refusal closes the store too.
                await self.state_home.claim()
                self.executor = Executor(
                    self.actor_kernel, self.app, code_version=self.code.version if self.code is not None else None
                )
                await self.executor.start()
            except BaseException:
                await self.close()
                raise
        if self._want_deliveries and self.app is not None and self.app.subscriptions:
            try:
                self.subscriptions_reconciled = await self._reconcile_subscriptions(self.app)
            except BaseException:
                await self.close()
                raise
        if self._want_deliveries:
            app = self.app
            self.deliveries = Deliveries(
                self._open_store, self.hub, self.appends, self.evaluations, self.signals, self.stream,
                settings=DeliverySettings.of(self.settings), max_event_bytes=self.settings.max_event_bytes,
                receivers=app.receivers if app is not None else None,
                processors=app.processors if app is not None else None,
                deploy_version=self.settings.deploy_version or (app.version if app is not None else None) or "",
                code_version=self.code.version if self.code is not None else None,
                application=self, clock=self.clock, tracing=self.tracing,
            )
            await self.deliveries.start()
            # Subscription catalogues missing, invalid or from another reducer
            # version are rebuilt from their logs (in the background, resumably).
            self.catalogues = asyncio.create_task(self._rebuild_catalogues(), name="yoke-catalogues")
            self._tasks.append(self.catalogues)
        self._disconnect.append(self.signals.stream_deleted.connect(self._deleted_wakes))
        if self.code is not None:
            self._tasks.append(
                asyncio.create_task(self.code.run(self.signals.code_changed.emit), name="yoke-reload")
            )
        self._tasks.append(
            asyncio.create_task(
                prune_forever(self._store, self.settings.prune_interval_s, self.clock), name="yoke-retention"
            )
        )
        self._tasks.append(
            asyncio.create_task(self.hub.sweep_forever(self.settings.tail_sweep_s), name="yoke-tail-sweep")
        )
        if self.settings.input_dispatch_s > 0:
            self._tasks.append(asyncio.create_task(
                self.inputs.run_forever(self.settings.input_dispatch_s), name="yoke-input-dispatch"
            ))

    async def _deleted_wakes(self, tenant: str, path: str) -> None:
        self.hub.wake(tenant, path)  # its tails read, find it gone and end
        self.hub.wake(tenant, "/")  # the yoke.stream.deleted fact

    async def close(self) -> None:
        """Stop accepting appends, finish the queued ones, stop background work."""
        if not self._started:
            return
        await self.connections.close_all()  # their ends recorded while the store is open
        if self.executor is not None:
            # Runs finish first: they may still append.
            await self.executor.stop(self.settings.shutdown_timeout_s)
            self.executor = None
        if self.deliveries is not None:
            # An interrupted delivery is sent again by whoever takes the lease.
            await self.deliveries.stop()
            self.deliveries = None
        if self._state_dbs is not None:
            await self._state_dbs.close()  # (what a closing connection noted is stashed)
            self._state_dbs = None
        if self._sql_mirror is not None:
            await asyncio.sleep(0)  # the closed databases' notices arrive
            await self._sql_mirror.stop()
            self._sql_mirror = None
        self.appends.closing = True
        self.appends.stop_blocking()
        await self.appends.drain()
        self._started = False  # from here on the store raises RuntimeClosed
        self.hub.wake_all()  # tails notice and end
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for disconnect in self._disconnect:
            disconnect()
        self._disconnect = []
        await self.evaluations.close()
        await self._store.close()
        if self.tracing.on:  # the last runs' spans leave before the process may end
            await asyncio.to_thread(self.tracing.flush)

    def stream(self, path: str, tenant: str = "default", *, caller: Caller = APPLICATION) -> Stream:
        """The stream at ``path``, for ``caller`` (``streams/rules.py``; the
        default is the application itself)."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Stream(self.kernel, path, tenant, caller=caller)

    async def streams(
        self, tenant: str = "default", prefix: str = "/", *, limit: int = 1000, after: str | None = None
    ) -> list[StreamInfo]:
        """Streams of ``tenant`` whose path starts with ``prefix``, by path."""
        validate_tenant(tenant)
        if (
            not isinstance(prefix, str) or not prefix.startswith("/") or "\x00" in prefix
            or len(prefix) > MAX_PATH_CHARS
        ):
            raise errors.InvalidPath(
                "a prefix starts with '/', has no NUL and at most 512 characters", path=str(prefix)[:80]
            )
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise errors.InvalidInput("limit must be 1-10000", field="limit")
        if after is not None:
            validate_path(after)
        return await self.store.list_streams(tenant, prefix, limit, after)

    # --- actors ----------------------------------------------------------------

    @property
    def worker_id(self) -> str | None:
        """This process's worker id when it runs an executor (new instances go to it)."""
        return None if self.executor is None else self.executor.worker_id

    def instances(self, tenant: str = "default") -> Instances:
        """Actor instances of ``tenant``: create, list, inspect, dead letters."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Instances(self.actor_kernel, tenant, app=self.app, worker_id=self.worker_id, forks=self._forks_of)

    def _forks_of(self, instances: Instances) -> Forks:
        return Forks(self.actor_kernel, instances.tenant, instances.get, instances.image, app=self.app,
                     load_app=load, ttl_s=self.settings.fork_ttl_s,
                     reload_version=lambda: self.code.version if self.code is not None else None)

    def forks(self, tenant: str = "default") -> Forks:
        """Forks of ``tenant``'s instances: made, listed, diffed, discarded
        (docs/advanced/forks.md)."""
        return self.instances(tenant).forks()

    async def check_deploy(
        self, candidate: App | str, *, current: App | str | None = None, actors: Sequence[str] | None = None,
        instances: int = 100, inputs: int = 1000, tenants: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The deploy check (docs/advanced/forks.md#the-deploy-check) over
        every tenant with instances (or ``tenants``): ``{"diverged", "checked",
        "tenants": [...]}``, each tenant's as actors/deploy_check.py makes it."""
        new = await load_named(load, candidate) if isinstance(candidate, str) else candidate
        now = None if current is None else (
            await load_named(load, current) if isinstance(current, str) else current)
        chosen = list(tenants) if tenants else await self.store.actors.tenants()
        reports = [
            await check_deploy(self.instances(t), new, current=now, actors=actors, sample=instances, inputs=inputs)
            for t in chosen
        ]
        return {"diverged": sum(r["diverged"] for r in reports), "checked": sum(r["checked"] for r in reports),
                "errors": sum(len(a["errors"]) for r in reports for a in r["actors"].values()), "tenants": reports}

    def failures(self, tenant: str = "default") -> Failures:
        """The failures inbox of ``tenant``: dead letters, halted subscriptions
        and skipped events, listed, replayed and discarded in one place."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return Failures(self._failure_services, tenant)

    def state_databases(self) -> StateDatabases:
        if self._state_dbs is None:
            storage = make_storage(
                self.settings.storage, store=self.store.actors, data_dir=self.settings.data_dir,
                settings=self.settings, postgres=not self.settings.database_url.startswith("sqlite"),
                clock=self.clock,
            )
            self._state_dbs = StateDatabases(
                storage, clock=self.clock, max_connections=max_open_databases(self.settings.actor_open_databases)
            )
            if self.settings.sql_mirror:
                self._sql_mirror = SqlMirror(self._state_dbs, lambda: self.store.catalogue)
                self._sql_mirror.start()
        return self._state_dbs

    async def sql(
        self, tenant: str, query: str, params: Sequence[Any] | None = None, *,
        max_rows: int | None = None, timeout_s: float | None = None,
    ) -> QueryResult:
        """One read-only SQL query in ``tenant`` over every actor instance's
        tables (``actor.table``), their state (``actor.yoke_state``) and
        Yoke's records (``yoke.instances``, ``yoke.streams``, ...):
        docs/advanced/sql.md."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return await self.sql_catalogue.query(tenant, query, params, max_rows=max_rows, timeout_s=timeout_s)

    async def sql_tables(self, tenant: str) -> list[CatalogueTable]:
        """What a ``sql`` query in ``tenant`` can name: each actor's tables
        with their columns, and Yoke's records."""
        if not self._started:
            raise errors.RuntimeClosed("the runtime is not open")
        return await self.sql_catalogue.tables(tenant)

    async def sql_settled(self) -> None:
        """Until the changes of finished runs are in the SQL catalogue
        (tests; a query sees them within about a second anyway)."""
        if self._sql_mirror is not None:
            await self._sql_mirror.settled()

    async def _reconcile_subscriptions(self, app: App) -> list[Reconciled]:
        """The subscriptions ``app`` declares, brought in line before any delivers."""
        return await reconcile(
            app.subscriptions.values(), lambda path, tenant: self.stream(path, tenant).subscription_operator(),
            self._open_store, declared_by=app.name, receivers=app.receivers, processors=app.processors,
            environ=os.environ, secrets=webhook_secrets(self.settings.webhook_secrets),
            remove_undeclared=self.settings.remove_undeclared_subscriptions,
        )

    async def _rebuild_catalogues(self) -> list[tuple[str, str]]:
        try:
            return await rebuild_stale_catalogues(
                self._open_store, lambda path, tenant: self.stream(path, tenant).subscription_operator()
            )
        except errors.RuntimeClosed:
            return []
        except Exception:
            log_retried(log, "checking the subscription catalogues failed")
            return []


    async def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Return once fan-out has caught up and no queue row is pending or
        processing (dead rows excepted). For tests and scripts; needs an app."""
        if self.executor is None:
            raise errors.InvalidInput("wait_idle needs a runtime opened with an app that has actors")
        try:
            await self.executor.wait_idle(timeout_s)
        except TimeoutError as exc:
            try:  # subscriptions are not waited for, but may be why (a halted copy into an actor's stream)
                lagging = await lag_report(self._open_store, wall_ms(self.clock))
            except errors.YokeError:
                lagging = ""
            if not lagging:
                raise
            raise TimeoutError(f"{exc}. {lagging}") from None

    def exposition(self) -> bytes:
        """``/metrics``: this process's series, the in-memory gauges refreshed
        first (never the database: it answers while the database is down)."""
        return metrics.exposition(
            self.buffers, self.hub.waiters, self.appends.appenders,
            self.deliveries.held() if self.deliveries is not None else [],
            with_path=self.settings.metrics_path_labels, pool=None if self.closed else self._store.pool_sizes(),
        )

    def sampler(self) -> Sampler:
        """The background pass that refreshes the database-sampled gauges
        (``sampling.py``; started by the servers that serve /metrics)."""
        return Sampler(
            self._open_store, self.failures, interval_s=self.settings.metrics_sample_s,
            max_tenants=self.settings.metrics_max_tenants, clock=self.clock,
        )

    async def ready(self) -> None:
        """Raise unless the store answers and is migrated (used by /readyz)."""
        await self.store.ready()

    async def prune(self) -> int:
        """Run one retention pass now (streams, and this process's actors'
        kept inputs); returns the number of events removed."""
        removed = await prune_once(self.store, self.clock)
        if self.executor is not None:
            await self.executor.history_retention.prune_once()
        return removed


@contextlib.asynccontextmanager
async def open(  # noqa: A001
    url: str | None = None,
    *,
    app: App | None = None,
    executor: bool = True,
    settings: Settings | None = None,
    clock: Clock = SYSTEM,
    tracer_provider: Any = None,
    **overrides: Any,
) -> AsyncIterator[Runtime]:
    """Open a runtime on ``url`` (default: ``YOKE_DATABASE_URL`` or
    ``sqlite:///./.yoke/yoke.db``). With ``app``, the runtime also runs the
    application's actors in this process (fan-out, scheduler, schedules,
    portal loops) unless ``executor=False``. Keyword arguments override
    settings; ``settings`` gives them all at once. ``clock``: where every
    time the runtime stamps or measures comes from (``clock.py``; tests).
    ``tracer_provider``: an OpenTelemetry provider for Yoke's spans (default:
    the global one, once installed; docs/advanced/tracing.md)."""
    if settings is None:
        settings = Settings.from_env(database_url=url, **overrides)
    runtime = Runtime(settings, app, executor=executor, clock=clock, tracer_provider=tracer_provider)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()
