"""The other paths a trace takes (docs/advanced/tracing.md): the Durable
Streams route, a delivery whose batch holds events of several traces (links),
a skipped webhook delivery replayed from the failures inbox (a link to the
original, the POST in the replay's trace), a call receiver running in its
delivery's span, and the global provider an application installs (Yoke
uses it and never replaces it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opentelemetry import trace

import yoke
from tests.subscriptions.webhook_server import Response, WebhookReceiver
from tests.tracing.test_traces import (
    CALLER_SPAN, SETTINGS, TRACE_ID, TRACEPARENT, api, named, parent_of, until,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_a_durable_streams_append_is_traced(fresh_url: str, spans) -> None:
    provider, exporter = spans
    async with yoke.open(fresh_url, tracer_provider=provider, executor=False) as y, api(y) as http:
        created = await http.put("/v1/stream/traced", headers={"content-type": "application/json"})
        assert created.status_code == 201, created.text
        answer = await http.post("/v1/stream/traced", content=b'{"n": 1}',
                                 headers={"content-type": "application/json", "traceparent": TRACEPARENT})
        assert answer.status_code in (200, 204), answer.text
    (send,) = [s for s in named(exporter, "send ") if s.attributes["messaging.operation.name"] == "protocol_append"]
    assert send.context.trace_id == TRACE_ID and parent_of(send) == CALLER_SPAN


async def test_a_batch_of_several_traces_is_delivered_in_a_trace_linked_to_each(fresh_url: str, spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    async with yoke.open(fresh_url, tracer_provider=provider, **SETTINGS) as y:
        source = y.stream("/src")
        with tracer.start_as_current_span("first") as first:
            await source.append({"type": "a"})
        with tracer.start_as_current_span("second") as second:
            last = await source.append({"type": "b"})
        await source.subscribe("copy", yoke.copy_to_stream("/dst"), filter={"types": ["a", "b"]}, start="beginning")
        await source.wait_until_processed("copy", last.offset, timeout_s=10)
        copies = [e for e in await y.stream("/dst").read(0) if e.type in ("a", "b")]
    (delivery,) = named(exporter, "process /src copy")
    assert delivery.parent is None  # a trace of its own...
    linked = {link.context.trace_id for link in delivery.links}  # ...linked to both
    assert linked == {first.get_span_context().trace_id, second.get_span_context().trace_id}
    assert delivery.attributes["messaging.batch.message_count"] == 2
    assert {e.metadata["traceparent"].split("-")[1] for e in copies} == {f"{delivery.context.trace_id:032x}"}


async def test_a_skipped_webhook_delivery_replayed_from_the_inbox_links_to_its_trace(
    fresh_url: str, spans
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    failing = {"on": True}

    def answer(request):  # noqa: ANN001, ANN202
        return Response(500) if failing["on"] else Response(204)

    async with WebhookReceiver(answer) as hook, yoke.open(fresh_url, tracer_provider=provider, **SETTINGS) as y:
        s = y.stream("/orders")
        await s.subscribe("hook", yoke.webhook(hook.url, secret="whsec_" + "A" * 44), filter={"types": ["order"]},
                          on_failing_event="skip")
        with tracer.start_as_current_span("checkout") as checkout:
            await s.append({"type": "order"})
        (failure,) = await until(lambda: y.failures().list())
        failing["on"] = False
        with tracer.start_as_current_span("operator") as operator:
            await y.failures().replay(failure.id)
    attempts = named(exporter, "process /orders hook")
    assert len(attempts) >= 4  # three failed attempts, then the replay's delivery
    *failed, replayed = attempts
    assert {a.context.trace_id for a in failed} == {checkout.get_span_context().trace_id}
    assert all(a.status.status_code is trace.StatusCode.ERROR for a in failed)
    (settle,) = named(exporter, "settle replay")
    assert replayed.context.trace_id == operator.get_span_context().trace_id
    assert parent_of(replayed) == settle.context.span_id and replayed.attributes["yoke.replayed"] is True
    assert [link.context.trace_id for link in replayed.links] == [checkout.get_span_context().trace_id]
    assert hook.requests[-1].headers["traceparent"].split("-")[2] == f"{replayed.context.span_id:016x}"


async def test_a_call_receiver_runs_in_its_delivery_span(fresh_url: str, spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    app = yoke.App()
    seen: list[int] = []

    @app.receiver("audit")
    async def audit(batch):  # noqa: ANN001, ANN202
        seen.append(trace.get_current_span().get_span_context().span_id)

    async with yoke.open(fresh_url, app=app, tracer_provider=provider, **SETTINGS) as y:
        s = y.stream("/orders")
        await s.subscribe("audit", yoke.call("audit"))
        with tracer.start_as_current_span("checkout"):
            appended = await s.append({"type": "order"})
        await s.wait_until_processed("audit", appended.offset, timeout_s=10)
    (delivery,) = named(exporter, "process /orders audit")
    assert seen == [delivery.context.span_id]


def test_the_applications_global_provider_gets_the_spans_and_stays(tmp_path: Path) -> None:
    """An application installs its SDK provider globally, as for any
    library; Yoke's spans go to it and it is still the global one after."""
    script = tmp_path / "app.py"
    script.write_text(f"""
import asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import yoke

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    async with yoke.open("sqlite:///{tmp_path}/y.db", executor=False) as y:
        with trace.get_tracer("shop").start_as_current_span("checkout"):
            await y.stream("/orders").append({{"type": "order.placed"}})
    assert trace.get_tracer_provider() is provider
    print(sorted(s.name for s in exporter.get_finished_spans()))

asyncio.run(main())
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         cwd=REPO_ROOT, check=True).stdout
    assert out.strip() == "['checkout', 'send /orders']"


async def test_workflow_receipts_are_of_the_records_as_stored(fresh_url: str, spans) -> None:
    """The records carry their trace context in their metadata: the receipt
    an append answers is the one fetched afterwards, of the stored record."""
    provider, _ = spans
    async with yoke.open(fresh_url, tracer_provider=provider, executor=False) as y, api(y) as http:
        base = "/api/workflow-streams/runs/r1/streams"
        assert (await http.post(base, json={"stream_id": "out"})).status_code == 201
        answer = await http.post(f"{base}/out/records", json=[{"type": "t", "payload": 1}, {"type": "p", "ephemeral": True}],
                                 headers={"traceparent": TRACEPARENT})
        one, ephemeral = answer.json()["results"]
        assert ephemeral["receipt"] is None
        fetched = (await http.get(f"{base}/out/receipts/{one['offset']}")).json()
        assert fetched == one["receipt"]
        (stored,) = [e for e in await y.stream("/runs/r1/out").read(0) if e.type == "t"]
        assert stored.metadata["traceparent"].split("-")[1] == f"{TRACE_ID:032x}"


async def test_the_testing_environment_takes_a_provider(spans) -> None:
    from yoke.testing import env

    provider, exporter = spans
    app = yoke.App()

    @app.actor("echo", filter={"types": ["ping"]})
    async def echo(ctx, event):  # noqa: ANN001, ANN202
        await ctx.append({"type": "pong"}, stream="/out")

    async with env(app, tracer_provider=provider) as e:
        await e.y.instances().create("echo", key="one")
        await e.y.stream("/in").append({"type": "ping"})
        await e.idle()
    (send,) = named(exporter, "send /in")
    (run,) = named(exporter, "process echo")
    assert parent_of(run) == send.context.span_id
