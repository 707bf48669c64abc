"""The application: actors and portals registered with decorators.

::

    app = App()

    @app.actor("coder", filter=Filter(types=["work.assigned"]), concurrency=1)
    async def coder(ctx, event): ...

An ``App`` is plain data; ``yoke.open(url, app=app)``, ``yoke serve --app``
and ``yoke worker --app`` run it.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import errors
from ..config import json_object_setting
from ..events import validate_path, validate_tenant
from ..routing.filters import Filter

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class ActorDef:
    name: str
    handler: Handler | None  # None: a script of another language's host
    filter: Filter | None = None
    # Derives each instance's filter from its config (instead of ``filter``).
    filter_from_config: Callable[[Mapping[str, Any]], Filter | Mapping[str, Any] | None] | None = None
    concurrency: int = 1
    max_attempts: int = 5
    timeout_s: float = 30.0
    singleton: bool = False
    retry_base_s: float = 1.0  # backoff: base * 2**(attempt-1), +-20% jitter, capped
    retry_max_s: float = 300.0
    # "process": process() runs in a host process (docs/advanced/hosts.md);
    # "inprocess": in the runtime's event loop; None: the worker's default.
    isolation: str | None = None
    # "python", or the host that runs ``script`` (app.node_actor: "node").
    language: str = "python"
    script: str | None = None
    # "default": effects commit one by one, journaled per queue row;
    # "atomic": a run's effects commit together with its completion (docs/advanced/effects.md).
    effects: str = "default"
    # The retry fields (RETRY_FIELDS) the decorator was given: they win over
    # the deployment's settings (with_retry_settings); the others take them.
    given: frozenset[str] = frozenset()
    # How long its instances' inputs are kept (docs/advanced/forks.md): the
    # newest ``keep_inputs`` of each instance, none older than
    # ``keep_inputs_s`` seconds; None: no bound.
    keep_inputs: int | None = None
    keep_inputs_s: float | None = None

    @property
    def keyed(self) -> bool:
        """Routed by key: one instance per key (or the singleton), created on demand."""
        return self.singleton or (self.filter is not None and self.filter.key is not None)

    def instance_filter(self, config: Mapping[str, Any]) -> Filter | None:
        """The filter a new instance gets (None: it only receives what is sent to it
        or, for keyed actors, what the actor's keyed route picks)."""
        if self.keyed:
            return None
        if self.filter_from_config is not None:
            derived = self.filter_from_config(config)
            return None if derived is None else Filter.from_dict(derived)
        return self.filter


@dataclass
class PortalDef:
    name: str
    handler: Handler
    tenant: str = "default"
    start_fn: Handler | None = None
    # Methods actors call with ctx.portals.call(portal, method, params).
    methods: dict[str, Handler] = field(default_factory=dict)
    # "python", or the host whose ``script`` defines it (node_calls.py):
    # then ``handler`` and ``methods`` forward to that host (node_calls.py).
    language: str = "python"
    script: str | None = None

    def start(self, fn: Handler) -> Handler:
        """Decorate ``async def loop(ctx)``: started with the runtime, restarted
        with backoff if it crashes, cancelled on shutdown."""
        self.start_fn = fn
        return fn

    def method(self, name: str) -> Callable[[Handler], Handler]:
        """Decorate ``async def fn(ctx, params)``: a method actors call with
        ``ctx.portals.call(portal, name, params)``; ``params`` and the value
        it returns are JSON."""
        _check_registered(name, self.methods, "portal method")

        def register(fn: Handler) -> Handler:
            if not inspect.iscoroutinefunction(fn):
                raise errors.InvalidInput(f"portal method {name!r} must be an async function")
            self.methods[name] = fn
            return fn

        return register


@dataclass(frozen=True)
class SubscriptionDef:
    """A subscription the application declares (``app.subscription``),
    reconciled with the database when the application starts
    (subscriptions/declared.py)."""

    tenant: str
    source: str
    name: str
    # copy_to_stream(), call(), processor() or webhook(url, secret=<a reference>)
    receiver: Any
    filter: Any = None
    transform: str | None = None
    start: str = "now"
    on_failing_event: str = "halt"


RECEIVER_KINDS = ("copy", "call", "processor", "webhook")


@dataclass
class App:
    version: str | None = None  # the deployment version (subscriptions resume on a new one)
    actors: dict[str, ActorDef] = field(default_factory=dict)
    portals: dict[str, PortalDef] = field(default_factory=dict)
    # Subscription receivers: call(name) functions and processor(name) folds.
    receivers: dict[str, Handler] = field(default_factory=dict)
    # The host pools running this application's code in this process, by
    # language (filled by its executor): where the portals and receivers of
    # a JavaScript application (node_calls.py) send their calls.
    hosts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    processors: dict[str, Any] = field(default_factory=dict)
    # module:attribute that names this App (set by load_app; hosts import it).
    spec: str | None = None
    # The App this one was made from (with_retry_settings): the name a
    # module binds is the original's.
    origin: App | None = field(default=None, repr=False, compare=False)
    # Subscriptions declared with app.subscription, by (tenant, source, name).
    subscriptions: dict[tuple[str, str, str], SubscriptionDef] = field(default_factory=dict)
    # Marks the subscriptions this application declares: applications that
    # share a database name themselves apart, so that neither reports (or
    # removes) the other's as no longer declared.
    name: str = "app"

    def definitions(self) -> dict[str, Any]:
        """What the application declares, without its code: actors (filter,
        policy, isolation, script), portals and their methods, subscriptions,
        receivers and processors. ``--reload`` compares it before and after a
        change (hosts/reload.py): a change here is not one new hosts can apply."""

        def filter_of(f: Any) -> Any:
            return f.to_dict() if hasattr(f, "to_dict") else f

        return {
            "actors": {
                name: {
                    "filter": filter_of(d.filter), "filter_from_config": d.filter_from_config is not None,
                    "concurrency": d.concurrency, "max_attempts": d.max_attempts, "timeout_s": d.timeout_s,
                    "singleton": d.singleton, "retry_base_s": d.retry_base_s, "retry_max_s": d.retry_max_s,
                    "isolation": d.isolation, "language": d.language, "script": d.script, "effects": d.effects,
                }
                for name, d in sorted(self.actors.items())
            },
            "portals": {
                name: {"tenant": d.tenant, "loop": d.start_fn is not None, "methods": sorted(d.methods)}
                for name, d in sorted(self.portals.items())
            },
            "subscriptions": {
                "|".join(key): repr((d.receiver, filter_of(d.filter), d.transform, d.start, d.on_failing_event))
                for key, d in sorted(self.subscriptions.items())
            },
            "receivers": sorted(self.receivers),
            "processors": sorted(self.processors),
        }

    def subscription(
        self,
        source: str,
        name: str,
        receiver: Any,
        *,
        tenant: str = "default",
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        transform: str | None = None,
        start: str = "now",
        on_failing_event: str = "halt",
    ) -> SubscriptionDef:
        """Declare a subscription of the stream ``source``: created when the
        application starts and it is missing, left alone when it stands as
        declared, reconfigured when the declaration changed
        (docs/basics/subscriptions.md, "Declared on the App"). A webhook's
        secret is given by reference: ``webhook(url,
        secret=secret_from_env("NAME"))`` or ``secret_from_setting("name")``."""
        validate_path(source)
        validate_tenant(tenant)
        if not isinstance(name, str) or not 1 <= len(name) <= 500 or "\x00" in name or name.startswith("subscription:"):
            raise errors.InvalidInput(
                "a declared subscription's name is 1-500 characters, not starting with 'subscription:'", field="name"
            )
        kind = getattr(receiver, "kind", None)
        if kind not in RECEIVER_KINDS:
            raise errors.InvalidInput(
                "receiver is copy_to_stream(), call(), processor() or webhook()", field="receiver"
            )
        if kind == "webhook" and getattr(receiver, "secret_ref", None) is None:
            raise errors.InvalidInput(
                f"subscription {name!r}: a declared webhook's secret is a reference, never in code:"
                " webhook(url, secret=secret_from_env('NAME')) or secret_from_setting('name')", field="secret",
            )
        if start not in ("now", "beginning"):
            raise errors.InvalidInput("start is 'now' or 'beginning'", field="start")
        if on_failing_event not in ("halt", "skip"):
            raise errors.InvalidInput("on_failing_event is 'halt' or 'skip'", field="on_failing_event")
        key = (tenant, source, name)
        if key in self.subscriptions:
            raise errors.InvalidInput(f"subscription {name!r} of {source} is already declared", field="name")
        declared = SubscriptionDef(
            tenant, source, name, receiver, None if filter is None else Filter.from_dict(filter), transform,
            start, on_failing_event,
        )
        self.subscriptions[key] = declared
        return declared

    def actor(
        self,
        name: str,
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        filter_from_config: Callable[[Mapping[str, Any]], Any] | None = None,
        concurrency: int = 1,
        max_attempts: int | None = None,
        timeout_s: float = 30.0,
        singleton: bool = False,
        retry_base_s: float | None = None,
        retry_max_s: float | None = None,
        isolation: str | None = None,
        effects: str = "default",
        keep_inputs: int | None = None,
        keep_inputs_s: float | None = None,
    ) -> Callable[[Handler], Handler]:
        check_isolation(isolation)
        define = self._definer(
            name, filter=filter, filter_from_config=filter_from_config, concurrency=concurrency,
            max_attempts=max_attempts, timeout_s=timeout_s, singleton=singleton,
            retry_base_s=retry_base_s, retry_max_s=retry_max_s, isolation=isolation, effects=effects,
            keep_inputs=keep_inputs, keep_inputs_s=keep_inputs_s,
        )

        def register(handler: Handler) -> Handler:
            if not inspect.iscoroutinefunction(handler):
                raise errors.InvalidInput(f"actor {name!r}: process must be an async function")
            define(handler=handler)
            return handler

        return register

    def node_actor(
        self,
        name: str,
        script: str | os.PathLike[str],
        *,
        filter: Filter | Mapping[str, Any] | None = None,  # noqa: A002
        filter_from_config: Callable[[Mapping[str, Any]], Any] | None = None,
        concurrency: int = 1,
        max_attempts: int | None = None,
        timeout_s: float = 30.0,
        singleton: bool = False,
        retry_base_s: float | None = None,
        retry_max_s: float | None = None,
        effects: str = "default",
        keep_inputs: int | None = None,
        keep_inputs_s: float | None = None,
    ) -> None:
        """An actor whose ``process(ctx, event)`` is exported by ``script``,
        a JavaScript module (compiled TypeScript, say) run by the Node host
        (yoke/hosts/node/README.md). The kernel routes, queues and retries
        its events as for any actor; it always runs in a host process.
        A relative ``script`` is taken from the current directory."""
        if not isinstance(script, (str, os.PathLike)) or not str(script):
            raise errors.InvalidInput("a Node actor's script is a path to a JavaScript module", field="script")
        self._definer(
            name, filter=filter, filter_from_config=filter_from_config, concurrency=concurrency,
            max_attempts=max_attempts, timeout_s=timeout_s, singleton=singleton,
            retry_base_s=retry_base_s, retry_max_s=retry_max_s, isolation="process", effects=effects,
            keep_inputs=keep_inputs, keep_inputs_s=keep_inputs_s,
        )(handler=None, language="node", script=os.path.abspath(script))

    def _definer(
        self, name: Any, *, filter: Any, filter_from_config: Any, concurrency: Any,  # noqa: A002
        max_attempts: Any, timeout_s: Any, singleton: bool, retry_base_s: Any, retry_max_s: Any,
        isolation: str | None, effects: str = "default", keep_inputs: Any = None, keep_inputs_s: Any = None,
    ) -> Callable[..., None]:
        """Checks an actor's settings now; the returned function registers it.
        A retry field left None takes the deployment's setting (or the default)."""
        retry = {"max_attempts": max_attempts, "retry_base_s": retry_base_s, "retry_max_s": retry_max_s}
        given = frozenset(k for k, v in retry.items() if v is not None)
        check_retry({k: v for k, v in retry.items() if v is not None}, "the actor's")
        resolved = {**RETRY_DEFAULTS, **{k: v for k, v in retry.items() if v is not None}}
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            raise errors.InvalidInput("an actor name is 1-200 characters", field="name")
        if name in self.actors:
            raise errors.InvalidInput(f"actor {name!r} is already registered", field="name")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise errors.InvalidInput("concurrency must be a positive integer", field="concurrency")
        if not timeout_s > 0:
            raise errors.InvalidInput("timeout_s must be positive", field="timeout_s")
        if effects not in EFFECTS:
            raise errors.InvalidInput(
                f"effects is one of {', '.join(EFFECTS)}, not {effects!r}", field="effects"
            )
        if keep_inputs is not None and (isinstance(keep_inputs, bool) or not isinstance(keep_inputs, int)
                                        or keep_inputs < 0):
            raise errors.InvalidInput("keep_inputs must be a number of inputs (0 or more)", field="keep_inputs")
        if keep_inputs_s is not None and (isinstance(keep_inputs_s, bool) or not isinstance(keep_inputs_s, (int, float))
                                          or not 0 <= keep_inputs_s < 2**53):
            raise errors.InvalidInput("keep_inputs_s must be a number of seconds (0 or more)", field="keep_inputs_s")
        parsed = None if filter is None else Filter.from_dict(filter)
        if singleton and parsed is not None and parsed.key is not None:
            raise errors.InvalidFilter("a singleton actor has no routing key", field="key")

        def define(handler: Handler | None, language: str = "python", script: str | None = None) -> None:
            if name in self.actors:
                raise errors.InvalidInput(f"actor {name!r} is already registered", field="name")
            self.actors[name] = ActorDef(
                name, handler, parsed, filter_from_config, concurrency, resolved["max_attempts"],
                float(timeout_s), singleton, float(resolved["retry_base_s"]), float(resolved["retry_max_s"]),
                isolation, language, script, effects, given, keep_inputs,
                None if keep_inputs_s is None else float(keep_inputs_s),
            )

        return define

    def portal(self, name: str, *, tenant: str = "default") -> Callable[[Handler], PortalDef]:
        """Decorate ``async def handle(ctx, request)`` (mounted at
        ``/v1/portals/<name>``); the result has ``.start`` for a loop."""
        check_portal_name(name)

        def register(handler: Handler) -> PortalDef:
            portal = PortalDef(name, handler, tenant)
            self.portals[name] = portal
            return portal

        return register

    def add_portal(self, portal: PortalDef) -> PortalDef:
        """Register a portal made elsewhere (a JavaScript application's,
        node_calls.py), with the checks ``portal`` makes."""
        check_portal_name(portal.name)
        if portal.name in self.portals:
            raise errors.InvalidInput(f"portal {portal.name!r} is already registered", field="name")
        validate_tenant(portal.tenant)
        self.portals[portal.name] = portal
        return portal

    def receiver(self, name: str) -> Callable[[Handler], Handler]:
        """Decorate ``async def receive(batch)`` for ``call(name)``
        subscriptions; ``batch`` is ``{events, path, name, stream_id,
        attempt, delivery_id}`` and returning acknowledges it."""
        _check_registered(name, self.receivers, "receiver")

        def register(handler: Handler) -> Handler:
            if not inspect.iscoroutinefunction(handler):
                raise errors.InvalidInput(f"receiver {name!r} must be an async function")
            self.receivers[name] = handler
            return handler

        return register

    def processor(self, name: str) -> Callable[[Any], Any]:
        """Decorate a stream processor class (instantiated without arguments)
        or object with ``initial_state()``, ``reduce(state, event)``, an
        optional ``async after(state, events, ctx)`` and a ``version``."""
        _check_registered(name, self.processors, "processor")

        def register(definition: Any) -> Any:
            instance = definition() if inspect.isclass(definition) else definition
            for method in ("initial_state", "reduce"):
                if not callable(getattr(instance, method, None)):
                    raise errors.InvalidInput(f"processor {name!r} needs a {method}() method")
            after = getattr(instance, "after", None)
            if after is not None and not inspect.iscoroutinefunction(after):
                raise errors.InvalidInput(f"processor {name!r}: after must be an async method")
            self.processors[name] = instance
            return definition

        return register

    def get(self, name: str) -> ActorDef:
        try:
            return self.actors[name]
        except KeyError:
            raise errors.UnknownActor(f"no actor named {name!r} in the application", actor=name) from None


ISOLATIONS = ("inprocess", "process")
EFFECTS = ("default", "atomic")

# An actor's retries: the decorator's arguments, else the deployment's
# per-actor setting (actor_retry), else its settings for every actor
# (actor_max_attempts, actor_retry_base_s, actor_retry_max_s), else these.
RETRY_DEFAULTS: dict[str, Any] = {"max_attempts": 5, "retry_base_s": 1.0, "retry_max_s": 300.0}
RETRY_FIELDS = tuple(RETRY_DEFAULTS)


def check_retry(values: Mapping[str, Any], whose: str) -> None:
    """``values``: some of RETRY_FIELDS, each in its domain."""
    for name, value in values.items():
        if name not in RETRY_FIELDS:
            raise errors.InvalidInput(f"{whose} retry settings are {', '.join(RETRY_FIELDS)}, not {name!r}",
                                      field=name)
        if name == "max_attempts":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise errors.InvalidInput("max_attempts must be a positive integer", field=name)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise errors.InvalidInput(f"{name} must be a number of seconds, 0 or more", field=name)


def per_actor_retry(text: str) -> dict[str, dict[str, Any]]:
    """The ``actor_retry`` setting: a JSON object of actor name to retry
    fields (``{"billing": {"max_attempts": 2}}``); "" is none."""
    return json_object_setting(
        text, "actor_retry", dict, 'an object of actor name to retry fields, e.g. {"billing": {"max_attempts": 2}}'
    )


def with_retry_settings(app: App, every: Mapping[str, Any], per_actor: Mapping[str, Mapping[str, Any]]) -> App:
    """``app`` with each actor's retry fields as the deployment sets them:
    ``every`` for all actors, ``per_actor[name]`` for one, the decorator's
    own arguments winning over both. Names in ``per_actor`` must be actors."""
    check_retry(every, "the deployment's")
    unknown = set(per_actor) - set(app.actors)
    if unknown:
        raise errors.InvalidInput(f"actor_retry names no actor of the app: {', '.join(sorted(unknown))}",
                                  field="actor_retry")
    actors = {}
    for name, d in app.actors.items():
        own = per_actor.get(name, {})
        check_retry(own, f"actor {name!r}'s")
        values = {**RETRY_DEFAULTS, **every, **own, **{f: getattr(d, f) for f in d.given}}
        actors[name] = replace(d, max_attempts=values["max_attempts"], retry_base_s=float(values["retry_base_s"]),
                               retry_max_s=float(values["retry_max_s"]))
    # No module holds the copy: its importable name is its origin's, looked
    # up when a host first needs it (find_spec).
    return replace(app, actors=actors, origin=app.origin or app)


def check_isolation(isolation: str | None) -> None:
    if isolation is not None and isolation not in ISOLATIONS:
        raise errors.InvalidInput(f"isolation is one of {', '.join(ISOLATIONS)}", field="isolation")


def code_of(definition: ActorDef) -> str | None:
    """What the actor's code is, as a kept input records it when the
    deployment names no version: ``code:`` and 12 hex digits of a hash of
    its handler's source (a Node actor's: its script), None when there is
    none to read."""
    try:
        if definition.script is not None:
            text = Path(definition.script).read_bytes()
        else:
            text = inspect.getsource(definition.handler).encode()  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    return "code:" + hashlib.sha256(text).hexdigest()[:12]


def find_spec(app: App) -> str | None:
    """``module:attribute`` naming ``app``: the one load_app was given, else
    a module-level name bound to it (remembered), else None."""
    if app.spec is not None:
        return app.spec
    import sys

    named = app.origin or app
    for module_name, module in list(sys.modules.items()):
        if module_name == "__main__" or getattr(module, "__file__", None) is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is named:
                app.spec = f"{module_name}:{attr}"
                return app.spec
    return None


def app_spec(app: App) -> str:
    """``module:attribute`` naming ``app``, for hosts to import (``find_spec``)."""
    found = find_spec(app)
    if found is not None:
        return found
    raise errors.InvalidInput(
        "actors with isolation='process' need their App importable as module:attribute"
        " (a module-level name, or App(spec='module:attribute'))", field="isolation",
    )


def check_portal_name(name: Any) -> None:
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise errors.InvalidInput("a portal name is letters, digits, '-' and '_'", field="name")


def _check_registered(name: Any, registry: Mapping[str, Any], what: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise errors.InvalidInput(f"a {what} name is 1-200 characters", field="name")
    if name in registry:
        raise errors.InvalidInput(f"{what} {name!r} is already registered", field="name")


def load_app(spec: str) -> App:
    """``module:attribute`` → the App it names (``yoke serve --app``)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise errors.InvalidInput(f"--app takes module:attribute, got {spec!r}")
    module = importlib.import_module(module_name)
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise errors.InvalidInput(f"{spec} is not a yoke.App")
    if app.spec is None:
        app.spec = spec
    return app
