"""A real export: ``yoke serve --tracing otlp`` sends its spans over
OTLP/HTTP, configured by the standard ``OTEL_*`` variables, to a receiver
here that decodes the protobuf payloads (``opentelemetry-proto``): the wire
format is checked, not only the in-process objects. And its log lines,
``--log-format json``, carry the trace and span ids of the run they were
made in."""

from __future__ import annotations

import gzip
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.http.conftest import own_database, start_server, stop_server

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class OtlpReceiver:
    """An OTLP/HTTP endpoint (``POST /v1/traces``, protobuf) keeping every span."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, str], object]] = []  # (resource attributes, Span)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
                if ok:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    with receiver.lock:
                        for resource_spans in request.resource_spans:
                            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                            for scope in resource_spans.scope_spans:
                                receiver.spans.extend((resource, s) for s in scope.spans)
                self.send_response(200 if ok else 400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, prefix: str, destination: str | None = None) -> list:
        """Spans whose name starts with ``prefix`` (of one stream, given ``destination``)."""
        with self.lock:
            return [s for _, s in self.spans if s.name.startswith(prefix) and (destination is None or any(
                a.key == "messaging.destination.name" and a.value.string_value == destination for a in s.attributes))]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own: in the session's, other tests' orders queue up for the billing actor."""
    with own_database(request.param, tmp_path, "yoke_otlp") as url:
        yield url


def test_yoke_serve_exports_spans_over_otlp_http(database: str, tmp_path: Path, otlp: OtlpReceiver) -> None:
    db_url = database
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(
        db_url, data, args=("--app", "tests.tracing.traced_app:app", "--tracing", "otlp", "--log-format", "json"),
        PYTHONPATH=str(REPO_ROOT), OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="billing-desk", YOKE_ACTOR_RETRY_BASE_S="0.01", YOKE_ACCESS_LOG="1",
    )
    try:
        path = f"/orders-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the session's, shared
        with server.client() as http:
            created = http.post("/v1/instances", json={"actor": "billing", "key": uuid.uuid4().hex})
            assert created.status_code == 201, created.text
            answer = http.post(f"/v1/streams{path}/-/events", json={"type": "order.placed", "payload": {"order": 3}},
                               headers={"traceparent": TRACEPARENT})
            assert answer.status_code == 201, answer.text
        deadline = time.monotonic() + 30
        # The session's PostgreSQL database holds other tests' orders: this test's stream only.
        while len(otlp.named("process billing", path)) < 2:
            assert time.monotonic() < deadline, [s.name for _, s in otlp.spans]
            time.sleep(0.05)
    finally:
        assert stop_server(server) == -signal.SIGTERM  # a clean stop
    (send,) = otlp.named(f"send {path}")
    attempts = otlp.named("process billing", path)
    assert {s.trace_id.hex() for s in [send, *attempts]} == {TRACE_ID}
    assert send.parent_span_id.hex() == "00f067aa0ba902b7"
    assert all(a.parent_span_id == send.span_id for a in attempts)
    assert sorted(a.status.code for a in attempts) == [0, 2]  # UNSET, ERROR (the first attempt)
    attributes = {a.key: a.value for a in send.attributes}
    assert attributes["messaging.system"].string_value == "yoke"
    assert attributes["messaging.destination.name"].string_value == path
    assert {r["service.name"] for r, _ in otlp.spans} == {"billing-desk"}  # OTEL_SERVICE_NAME
    # The append's access log line names the caller's trace and span.
    lines = [orjson.loads(line) for line in (tmp_path / f"server-{server.url.rsplit(':', 1)[1]}.log").read_text().splitlines()
             if line.startswith("{")]
    traced = [line for line in lines if line.get("trace_id") == TRACE_ID]
    assert [(line["method"], line["path"], line["span_id"]) for line in traced] == [
        ("POST", f"/v1/streams{path}/-/events", "00f067aa0ba902b7")
    ]
