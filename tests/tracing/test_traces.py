"""One trace per event's journey (docs/advanced/tracing.md), collected with
the OpenTelemetry SDK's in-memory exporter from a runtime opened with
``tracer_provider=``: an HTTP append carrying a ``traceparent`` reaches an
actor that fails once and then appends to a stream, which a subscription
copies to another stream, which a webhook subscription posts to a real
HTTP receiver. Every span is in the caller's trace, each the child of the
one before; the webhook's POST carries the delivery's context.

Runs on SQLite and PostgreSQL (``fresh_url``: a delivery engine claims every
subscription of its database), in process, in a Python host process and in
the Node host (there also with @opentelemetry/api: the handler's active
context is the attempt's)."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import yoke
from yoke.http.app import asgi_app, create_app, serve_runtime
from tests.subscriptions.common import FAST
from tests.subscriptions.webhook_server import WebhookReceiver
from tests.tracing import traced_app

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{CALLER_SPAN:016x}-01"
SETTINGS = {**FAST, "shutdown_timeout_s": 2, "host_processes": 1}
WAIT_S = 20


def api(y: yoke.Runtime) -> httpx.AsyncClient:
    """The HTTP API of ``y`` as ``yoke serve --dev`` serves it (no socket)."""
    app = create_app(lambda: None, dev=True)
    serve_runtime(app, y)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app(app)), base_url="http://yoke.test")


async def until(check, timeout_s: float = WAIT_S):  # noqa: ANN001, ANN201
    async with asyncio.timeout(timeout_s):
        while not (found := await check()):
            await asyncio.sleep(0.02)
    return found


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in exporter.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time)


async def invoices(y: yoke.Runtime) -> list[yoke.Event]:
    return [e for e in await y.stream("/invoices").read(0) if e.type == "invoice.sent"]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


@pytest.mark.parametrize("actor", ["billing", "billing_host", "billing_node", "billing_node_otel"])
async def test_an_http_append_through_a_failing_actor_a_copy_and_a_webhook_is_one_trace(
    fresh_url: str, tmp_path, spans, actor: str
) -> None:
    if actor.startswith("billing_node") and shutil.which("node") is None:
        pytest.skip("needs Node.js (make test has it)")
    provider, exporter = spans
    async with WebhookReceiver() as hook, yoke.open(
        fresh_url, app=traced_app.app, tracer_provider=provider, data_dir=str(tmp_path), **SETTINGS
    ) as y, api(y) as http:
        await y.instances().create(actor, key="eu")
        await y.stream("/invoices").subscribe("ledger", yoke.copy_to_stream("/ledger"))
        await y.stream("/ledger").subscribe("hook", yoke.webhook(hook.url, secret="whsec_" + "A" * 44))

        answer = await http.post("/v1/streams/orders/-/events", json={"type": "order.placed", "payload": {"order": 7}},
                                 headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
        assert answer.status_code == 201, answer.text
        await until(lambda: asyncio.sleep(0, hook.requests))
        await until(lambda: asyncio.sleep(0, named(exporter, "process /ledger")))

    (send,) = named(exporter, "send /orders")
    attempts = named(exporter, f"process {actor}")
    (copy,) = named(exporter, "process /invoices ledger")
    (post,) = named(exporter, "process /ledger hook")
    every = [send, *attempts, copy, post]
    assert {s.context.trace_id for s in every} == {TRACE_ID}
    # In parent order: the caller's span, the append, each attempt, the copy, the webhook.
    assert parent_of(send) == CALLER_SPAN
    assert [a.attributes["yoke.attempt"] for a in attempts] == [1, 2]
    assert all(parent_of(a) == send.context.span_id for a in attempts)
    assert parent_of(copy) == attempts[1].context.span_id
    assert parent_of(post) == copy.context.span_id
    # The first attempt failed with its error; the second did not.
    failed, done = attempts
    assert failed.status.status_code is StatusCode.ERROR and "card declined" in failed.status.description
    assert any(e.name == "exception" and "card declined" in str(e.attributes.get("exception.message"))
               for e in failed.events)
    assert done.status.status_code is StatusCode.UNSET and done.attributes["yoke.retry"] is True
    # The messaging conventions and Yoke's own attributes.
    assert send.kind is trace.SpanKind.PRODUCER and send.attributes["messaging.system"] == "yoke"
    assert send.attributes["messaging.destination.name"] == "/orders"
    assert send.attributes["messaging.operation.type"] == "send"
    assert done.attributes["messaging.operation.type"] == "process"
    assert done.attributes["yoke.actor"] == actor and done.attributes["yoke.key"] == "eu"
    assert done.attributes["yoke.offset"] == 1 and done.attributes["messaging.destination.name"] == "/orders"
    assert done.attributes["yoke.queue.wait_ms"] >= 0
    assert copy.attributes["yoke.subscription"] == "ledger" and copy.attributes["yoke.receiver"] == "copy"
    # The run's append: an op event on its attempt, and its send span, a child of the attempt.
    assert [e.attributes["yoke.op"] for e in done.events if e.name.startswith("yoke.op")] == ["stream_append"]
    (emitted,) = named(exporter, "send /invoices")
    assert parent_of(emitted) == done.context.span_id and emitted.attributes["yoke.offset"] >= 1

    # The handler ran in the attempt's trace (the host received it with the run).
    async with yoke.open(fresh_url, executor=False) as y:
        (invoice,) = [e for e in await y.stream("/invoices").read(0) if e.type == "invoice.sent"]
        assert invoice.payload["seen"] == f"{TRACE_ID:032x}"
        assert invoice.metadata["traceparent"].split("-")[2] == f"{done.context.span_id:016x}"
        (order,) = await y.stream("/orders").read(0)
        assert order.metadata["traceparent"] == f"00-{TRACE_ID:032x}-{send.context.span_id:016x}-01"
        assert order.metadata["tracestate"] == "vendor=1"
    # The webhook's receiver joins the trace: its POST carries the delivery's context.
    (request,) = hook.requests
    assert request.headers["traceparent"] == f"00-{TRACE_ID:032x}-{post.context.span_id:016x}-01"


async def test_a_retry_answered_by_the_journal_makes_no_second_append(fresh_url: str, tmp_path, spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    async with yoke.open(fresh_url, app=traced_app.app, tracer_provider=provider, data_dir=str(tmp_path),
                         **SETTINGS) as y:
        await y.instances().create("journaled", key="eu")
        with tracer.start_as_current_span("checkout"):
            await y.stream("/orders").append({"type": "order.placed", "payload": {"order": 1}})
        await until(lambda: asyncio.sleep(0, len(named(exporter, "process journaled")) == 2))
        assert len(await invoices(y)) == 1
    first, second = named(exporter, "process journaled")
    ops = [[(e.attributes["yoke.op"], e.attributes.get("yoke.journal.replayed", False)) for e in a.events
            if e.name.startswith("yoke.op")] for a in (first, second)]
    assert ops == [[("stream_append", False)], [("stream_append", True)]]
    # One event, one effect span: the first attempt's; the retry's answer from the journal makes none.
    (emitted,) = named(exporter, "send /invoices")
    assert parent_of(emitted) == first.context.span_id


async def test_a_redrive_links_to_the_original_trace(fresh_url: str, tmp_path, spans, monkeypatch) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    monkeypatch.setitem(traced_app.FRAGILE, "broken", True)
    async with yoke.open(fresh_url, app=traced_app.app, tracer_provider=provider, data_dir=str(tmp_path),
                         **SETTINGS) as y:
        instances = y.instances()
        info = await instances.create("fragile", key="eu")
        with tracer.start_as_current_span("checkout") as checkout:
            await y.stream("/orders").append({"type": "order.placed", "payload": {"order": 1, "x": -0.0}})
        await until(lambda: instances.dead(info.instance_id))
        traced_app.FRAGILE["broken"] = False
        with tracer.start_as_current_span("operator") as operator:
            assert await instances.redrive(info.instance_id) == 1
        (invoice,) = await until(lambda: invoices(y))
        assert invoice.payload["sign"] == -1  # the redrive noted its trace and kept the event as it was
        await y.wait_idle(timeout_s=WAIT_S)
    dead, replayed = named(exporter, "process fragile")
    (settle,) = named(exporter, "settle redrive")
    assert dead.context.trace_id == checkout.get_span_context().trace_id
    assert dead.attributes.get("yoke.dead_lettered") is True
    # The redriven attempt belongs to the operator's trace, linked to the event's.
    assert settle.context.trace_id == operator.get_span_context().trace_id
    assert replayed.context.trace_id == operator.get_span_context().trace_id
    assert parent_of(replayed) == settle.context.span_id and replayed.attributes["yoke.replayed"] is True
    assert [link.context.trace_id for link in replayed.links] == [checkout.get_span_context().trace_id]


async def test_an_inbox_replay_links_to_the_original_trace(fresh_url: str, tmp_path, spans, monkeypatch) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    monkeypatch.setitem(traced_app.FRAGILE, "broken", True)
    async with yoke.open(fresh_url, app=traced_app.app, tracer_provider=provider, data_dir=str(tmp_path),
                         **SETTINGS) as y:
        info = await y.instances().create("fragile", key="eu")
        with tracer.start_as_current_span("checkout") as checkout:
            await y.stream("/orders").append({"type": "order.placed", "payload": {"order": 1}})
        await until(lambda: y.instances().dead(info.instance_id))
        traced_app.FRAGILE["broken"] = False
        (failure,) = await y.failures().list()
        with tracer.start_as_current_span("operator") as operator:
            await y.failures().replay(failure.id)
        await until(lambda: invoices(y))
    _, replayed = named(exporter, "process fragile")
    (settle,) = named(exporter, "settle replay")
    assert settle.context.trace_id == operator.get_span_context().trace_id
    assert parent_of(replayed) == settle.context.span_id
    assert [link.context.trace_id for link in replayed.links] == [checkout.get_span_context().trace_id]


async def test_tracing_off_stores_and_makes_nothing(fresh_url: str, tmp_path) -> None:
    """No provider installed (the API's no-op): a traceparent the caller
    sends is not stored, and the events are what they were without tracing."""
    async with yoke.open(fresh_url, app=traced_app.app, data_dir=str(tmp_path), **SETTINGS) as y, api(y) as http:
        assert not y.tracing.on
        answer = await http.post("/v1/streams/orders/-/events", json={"type": "order.placed", "payload": {"order": 1}},
                                 headers={"traceparent": TRACEPARENT})
        assert answer.status_code == 201
        (event,) = await y.stream("/orders").read(0)
        assert event.metadata == {}


async def test_an_idempotent_repeat_under_another_trace_is_the_same_event(fresh_url: str, spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    async with yoke.open(fresh_url, tracer_provider=provider, executor=False) as y:
        s = y.stream("/orders")
        event = {"type": "order.placed", "payload": {"order": 1}, "idempotency_key": "k1"}
        with tracer.start_as_current_span("first"):
            first = await s.append(event)
        with tracer.start_as_current_span("retry"):
            again = await s.append(event)
        assert again == first and again.duplicate and not first.duplicate
        sends = named(exporter, "send /orders")
        assert [s.attributes.get("yoke.duplicate", False) for s in sends] == [False, True]
        (stored,) = await s.read(0)  # the first caller's context stays
        assert stored.metadata["traceparent"].split("-")[2] == f"{sends[0].context.span_id:016x}"
        # A caller's own traceparent in the metadata is kept as it is.
        mine = {"type": "x", "metadata": {"traceparent": TRACEPARENT}}
        with tracer.start_as_current_span("own"):
            result = await s.append(mine)
        (kept,) = await s.read(result.offset - 1)
        assert kept.metadata == {"traceparent": TRACEPARENT}
