"""Yoke's traces, through the OpenTelemetry API (docs/advanced/tracing.md).

Yoke instruments as a library does: its spans go to the tracer provider the
application installed globally (or the one handed to ``yoke.open``), and it
never installs one itself, except where it owns the process (``yoke serve``
and ``yoke worker`` with ``--tracing otlp``: ``install_otlp``). With no
provider every entry point here is one check that answers "off": nothing is
made, nothing is stored.

The invariant the rest relies on: a trace context travels with an event in
its metadata, under the W3C names ``traceparent`` and ``tracestate`` (as
CloudEvents' distributed tracing extension carries it), stamped at the
append with the context of the span that committed it (an append's ``send``
span; a run's attempt span for what the run appends; a delivery's span for
a copy). Whatever processes the event (a run attempt, a subscription
delivery) starts its span as a child of that context, so one trace follows
the event from the appender through every hop. An event whose caller set
``traceparent`` in its metadata keeps it. The stamp is not part of the
event's identity: an idempotent repeat under another trace is the same
event (``events.prepare`` fingerprints before the stamp).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .build import __version__

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# The key a replay or redrive leaves in a queue row's event document: the
# context of the span that replayed it (the next attempt's parent; the
# event's own trace becomes a link).
REPLAYED_IN = "replayed_in"
SYSTEM = "yoke"
MAX_LINKS = 32  # links of a delivery span whose events come from several traces

# What is stored is W3C trace context whatever the process's propagators:
# another process (or a later version) reads it back the same way.
_W3C = TraceContextTextMapPropagator()

# The span of the run whose op is being carried out in this context: what a
# run appends is stamped with it (or with a span of the handler's own below
# it); its ``send`` span is made after the commit, and only if it appended.
_RUN: contextvars.ContextVar[Span | None] = contextvars.ContextVar("yoke_run_span", default=None)

Carrier = dict[str, str]


class Deferred:
    """The attributes of a run's ``send`` span, made once its commit is answered."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value


class Tracing:
    """Where Yoke's spans go: ``provider`` when given, else the global
    provider once the application installs one. ``on`` is the one check
    every traced path makes first."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer: trace.Tracer | None = None

    @property
    def on(self) -> bool:
        if self._tracer is not None:
            return True
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return False  # no SDK installed: the API's no-op, and nothing to do
        self._tracer = provider.get_tracer("yoke", __version__)
        return True

    def flush(self, timeout_ms: int = 5000) -> None:
        """Export what the provider holds (at close: a process that ends on
        its signal runs no exit handler). Blocking: call it on a thread."""
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if callable(force_flush):
            force_flush(timeout_ms)

    @property
    def tracer(self) -> trace.Tracer:
        assert self.on and self._tracer is not None
        return self._tracer

    # --- appends ---------------------------------------------------------------

    @contextlib.contextmanager
    def sending(
        self, tenant: str, path: str, events: Sequence[Any], *, operation: str = "append"
    ) -> Iterator[Span | Deferred]:
        """Around an append's commit: a ``send`` span (a child of the
        caller's current context) whose context is stamped on ``events``
        (PreparedEvents), ended when the commit is answered.

        Inside a run's op the events carry the run's context (or that of the
        handler's own current span, when it is in the run's trace), and the
        span is made once the commit is answered, with the times it took,
        unless nothing was appended (a repeat the journal answered): a
        retry makes no second effect span. The caller sets attributes on
        what this yields either way."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.destination.name": path,
            "messaging.operation.type": "send", "messaging.operation.name": operation, "yoke.tenant": tenant,
        }
        if len(events) == 1:
            attributes["messaging.message.id"] = events[0].id
        else:
            attributes["messaging.batch.message_count"] = len(events)
        run = _RUN.get()
        if run is None:
            with self.tracer.start_as_current_span(f"send {path}", kind=SpanKind.PRODUCER, attributes=attributes) as span:
                stamp(events, carrier_of(span))
                yield span
            return
        current = trace.get_current_span()
        parent = current if current.get_span_context().trace_id == run.get_span_context().trace_id else run
        stamp(events, carrier_of(parent))
        deferred = Deferred(attributes)
        started = time.time_ns()
        failure: BaseException | None = None
        try:
            yield deferred
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if failure is not None or not deferred.attributes.get("yoke.duplicate"):
                span = self.tracer.start_span(
                    f"send {path}", context=trace.set_span_in_context(parent), kind=SpanKind.PRODUCER,
                    attributes=deferred.attributes, start_time=started,
                )
                end(span, None if failure is None else f"{type(failure).__name__}: {failure}", failure)

    # --- runs --------------------------------------------------------------------

    def start_attempt(
        self, *, tenant: str, actor: str, instance_id: str, key: str | None, qid: int, attempt: int,
        event: Mapping[str, Any], path: str | None, enqueued_at: int, available_at: int, started_ms: int,
    ) -> Span:
        """The span of one run attempt of a queue row: a child of the event's
        context (of the replay's, linked to the event's, after a replay or
        redrive). Ended by ``end``, when the attempt ends."""
        own = context_of(event.get("metadata"))
        replayed = event.get(REPLAYED_IN)
        links: list[Link] = []
        parent = own
        if isinstance(replayed, str):
            parent = context_of({TRACEPARENT: replayed})
            if own is not None:
                links.append(Link(trace.get_current_span(own).get_span_context(), {"yoke.link": "replay_of"}))
        # A first attempt waited from fan-out; a retry, or the first attempt
        # after a replay (its count starts again), from when it became due.
        waited_from = enqueued_at if attempt <= 1 and not isinstance(replayed, str) else available_at
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.consumer.group.name": actor,
            "yoke.tenant": tenant, "yoke.actor": actor, "yoke.instance_id": instance_id,
            "yoke.queue_row": qid, "yoke.attempt": attempt, "yoke.retry": attempt > 1,
            "yoke.queue.wait_ms": max(0, started_ms - waited_from),
        }
        if key is not None:
            attributes["yoke.key"] = key
        if path is not None:
            attributes["messaging.destination.name"] = path
        if event.get("offset"):
            attributes["yoke.offset"] = event["offset"]
        if event.get("id"):
            attributes["messaging.message.id"] = event["id"]
            attributes["yoke.event_id"] = event["id"]
        if isinstance(replayed, str):
            attributes["yoke.replayed"] = True
        span = self.tracer.start_span(
            f"process {actor}", context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.CONSUMER, attributes=attributes, links=links,
        )
        if attempt <= 1 and not isinstance(replayed, str):
            # Fan-out put it in the queue then: the wait shows on the timeline.
            span.add_event("yoke.enqueued", {"yoke.queue.wait_ms": attributes["yoke.queue.wait_ms"]},
                           timestamp=enqueued_at * 1_000_000)
        return span

    # --- deliveries --------------------------------------------------------------

    def start_delivery(
        self, *, tenant: str, path: str, name: str, kind: str, attempt: int, generation: int,
        events: Sequence[Any], replay: bool = False,
    ) -> Span:
        """The span of one delivery attempt of a subscription: a child of its
        events' context when they share one trace, else a root linked to each
        (the first ``MAX_LINKS``). ``replay`` (the failures inbox delivering
        once more): a child of the current context, linked to the events'."""
        contexts = [c for c in (context_of(e.metadata) for e in events) if c is not None]
        spans = [trace.get_current_span(c).get_span_context() for c in contexts]
        parent = contexts[0] if contexts and len({s.trace_id for s in spans}) == 1 else None
        if replay:
            parent = otel_context.get_current()
        links = [] if parent is not None and not replay else [Link(s, {"yoke.link": "replay_of"} if replay else None)
                                                             for s in spans[:MAX_LINKS]]
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.destination.name": path,
            "messaging.operation.type": "process", "messaging.operation.name": kind,
            "messaging.consumer.group.name": name, "yoke.tenant": tenant, "yoke.subscription": name,
            "yoke.receiver": kind, "yoke.attempt": attempt, "yoke.retry": attempt > 1,
            "yoke.generation": generation, "yoke.offset": events[0].offset if events else 0,
        }
        if len(events) == 1:
            attributes["messaging.message.id"] = events[0].id
            attributes["yoke.event_id"] = events[0].id
        else:
            attributes["messaging.batch.message_count"] = len(events)
        if replay:
            attributes["yoke.replayed"] = True
        return self.tracer.start_span(
            f"process {path} {name}", context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.CONSUMER, attributes=attributes, links=links,
        )

    # --- inbox -------------------------------------------------------------------

    @contextlib.contextmanager
    def replaying(self, tenant: str, what: str, **attributes: Any) -> Iterator[str | None]:
        """Around a replay or redrive: a ``settle`` span in the caller's
        trace; yields the traceparent the replayed rows keep (``REPLAYED_IN``)."""
        with self.tracer.start_as_current_span(
            f"settle {what}", kind=SpanKind.INTERNAL,
            attributes={"messaging.system": SYSTEM, "messaging.operation.type": "settle",
                        "messaging.operation.name": what, "yoke.tenant": tenant,
                        **{f"yoke.{k}": v for k, v in attributes.items() if v is not None}},
        ) as span:
            yield carrier_of(span).get(TRACEPARENT)


@contextlib.contextmanager
def ending(span: Span | None) -> Iterator[None]:
    """``span`` current for the block, then ended: failed with the
    exception that leaves the block, if one does."""
    if span is None:
        yield
        return
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield
    except BaseException as exc:
        end(span, f"{type(exc).__name__}: {exc}", exc)
        raise
    end(span)


@contextlib.contextmanager
def in_run(span: Span | None) -> Iterator[None]:
    """The context of a run's op (or of its in-process handler): ``span``
    current, and marked as the run's (``Tracing.sending``)."""
    if span is None:
        yield
        return
    token = _RUN.set(span)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield
    finally:
        _RUN.reset(token)


def op_event(span: Span | None, method: str, started: float, *, error: BaseException | None = None,
             replayed: bool = False) -> None:
    """One op of a run as an event on its attempt span: cheap (no span of its
    own); ``replayed``: answered from the journal, no effect made again."""
    if span is None or not span.is_recording():
        return
    attributes: dict[str, Any] = {"yoke.op": method, "yoke.op.duration_ms": round((time.perf_counter() - started) * 1000, 3)}
    if replayed:
        attributes["yoke.journal.replayed"] = True
    if error is not None:
        attributes["yoke.op.error"] = f"{type(error).__name__}: {error}"[:512]
    span.add_event(f"yoke.op {method}", attributes)


def end(
    span: Span | None, error: str | None = None, exc: BaseException | None = None, *, stacktrace: str = ""
) -> None:
    """End ``span``, failed with ``error`` when given (and the exception, or
    a stack trace as text: a host's, which has no exception object here)."""
    if span is None:
        return
    if error is not None:
        if exc is not None:
            span.record_exception(exc)
        else:
            span.add_event("exception", {
                "exception.type": error.split(":", 1)[0][:256], "exception.message": error[:4096],
                "exception.stacktrace": stacktrace[-16384:],
            })
        span.set_status(Status(StatusCode.ERROR, error[:1024]))
    span.end()


# --- carrying contexts ---------------------------------------------------------------


def carrier_of(span: Span) -> Carrier:
    """``span``'s context as W3C headers (``traceparent``, ``tracestate``)."""
    c = span.get_span_context()
    if not c.is_valid:
        return {}
    # W3C's format, written here (the propagator's inject costs a context and a regex per call).
    carrier = {TRACEPARENT: f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"}
    if c.trace_state:
        carrier[TRACESTATE] = c.trace_state.to_header()
    return carrier


def context_of(metadata: Any) -> otel_context.Context | None:
    """The context an event's metadata carries, if any (a malformed one: none)."""
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get(TRACEPARENT), str):
        return None
    carrier = {TRACEPARENT: metadata[TRACEPARENT]}
    if isinstance(metadata.get(TRACESTATE), str):
        carrier[TRACESTATE] = metadata[TRACESTATE]
    found = _W3C.extract(carrier)
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def stamp(events: Sequence[Any], carrier: Carrier, *, replace: bool = False) -> None:
    """Put ``carrier`` in each PreparedEvent's metadata (``replace``: over
    the context it carries, as a copy does; otherwise an event whose
    metadata already names a ``traceparent`` keeps it). Its size grows by
    what was added: the event cap was checked before, on what the caller sent."""
    if not carrier:
        return
    for event in events:
        metadata = orjson.loads(event.metadata_json)
        if not isinstance(metadata, dict) or (TRACEPARENT in metadata and not replace):
            continue
        metadata.pop(TRACESTATE, None)
        metadata.update(carrier)
        text = orjson.dumps(metadata).decode()
        grown = len(text) - len(event.metadata_json)
        try:
            event.metadata_json = text
        except AttributeError:  # a Durable Streams message: the protocol's messages carry no metadata
            continue
        event.size += grown


def stamp_current(events: Sequence[Any]) -> None:
    """Stamp ``events`` with the current span's context, over what they
    carry (a copy made in a delivery's span); nothing when no span is current."""
    span = trace.get_current_span()
    if span.get_span_context().is_valid:
        stamp(events, carrier_of(span), replace=True)


def extract_headers(headers: Mapping[str, str]) -> otel_context.Context:
    """The context an incoming request's headers carry (the process's propagators)."""
    from opentelemetry import propagate  # here: it reads OTEL_PROPAGATORS when imported

    return propagate.extract(headers)


def inject_current(headers: dict[str, str]) -> None:
    """The current span's context into an outgoing request's headers (the
    process's propagators); nothing when no span is current."""
    if trace.get_current_span().get_span_context().is_valid:
        from opentelemetry import propagate

        propagate.inject(headers)


def log_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, for a log line."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def install_otlp(service_name: str = "yoke") -> None:
    """For ``yoke serve`` and ``yoke worker`` (Yoke owns the process): an SDK
    provider exporting over OTLP/HTTP, configured by the standard ``OTEL_*``
    variables (endpoint, headers, sampler, service name), installed as the
    global provider unless one is already there."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # the optional dependencies
        raise RuntimeError(
            "tracing=otlp needs the OpenTelemetry SDK and its OTLP exporter: pip install 'yoke[tracing]'"
        ) from exc
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # the application installed its own: Yoke never replaces it
    import os

    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def shutdown() -> None:
    """Flush and stop the global SDK provider, if Yoke's process has one."""
    provider = trace.get_tracer_provider()
    stop = getattr(provider, "shutdown", None)
    if callable(stop):
        stop()
