"""The billing example, end to end, on SQLite and on PostgreSQL.

Each test runs the service in this process (``yoke.open(url, app=...)``),
sends customer events through the portal's real HTTP route (the FastAPI app
``yoke serve`` runs, over an in-process ASGI transport) and receives the
invoices on a small webhook receiver (the standard library's HTTP server,
in a thread) that checks every POST with the ``standardwebhooks`` library,
as an accounting system would.

Run: ``.venv/bin/python -m pytest examples/billing`` from the repository root.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import yoke
from examples.billing.app import PLANS, UNIT_PRICE_CENTS, make_app
from yoke.http.app import create_app, serve_runtime
from yoke.testing import scratch_database

ROOT = Path(__file__).resolve().parents[2]  # the repository root
PG_ADMIN_URL = os.environ.get("YOKE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

# A fast retry ladder: a receiver answering 500 halts the subscription after
# its 15 attempts in well under a second (the defaults take hours).
FAST = {
    "subscription_sweep_s": 0.05,
    "subscription_retry_base_s": 0.001,
    "subscription_retry_max_s": 0.005,
}


# --- the database: one of the test's own, on each backend ------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async with scratch_database(request.param == "postgres", PG_ADMIN_URL) as url:
        yield url


# --- the accounting system's webhook receiver ---------------------------------------------


@dataclass
class Receiver:
    """Verifies each POST (Standard Webhooks), answers 500 while ``broken``,
    and keeps each invoice once, by its ``webhook-id`` (redeliveries happen)."""

    secret: str
    broken: bool = False
    url: str = ""
    answers: list[int] = field(default_factory=list)  # every POST's status, in order
    invoices: dict[str, dict[str, Any]] = field(default_factory=dict)  # webhook-id -> the signed body
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        try:
            signed = Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            status = 401
        else:
            if self.broken:
                status = 500
            else:
                with self.lock:
                    self.invoices.setdefault(headers["webhook-id"], signed)
                status = 204
        with self.lock:
            self.answers.append(status)
        return status


@contextlib.contextmanager
def serving(receiver: Receiver):  # noqa: ANN201
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Yoke's sender uses it

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status = receiver.handle({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/invoices"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- the service ---------------------------------------------------------------------------


@dataclass
class Service:
    y: yoke.Runtime
    http: httpx.AsyncClient
    hook: Receiver

    async def post(self, idempotency_key: str, **event: Any) -> httpx.Response:
        return await self.http.post("/v1/portals/billing", json=event, headers={"Idempotency-Key": idempotency_key})

    async def invoices(self) -> list[yoke.Event]:
        return [e for e in await self.y.stream("/invoices").read(0, limit=1000) if e.type == "invoice.issued"]


@pytest.fixture
async def service(db_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    monkeypatch.setenv("BILLING_WEBHOOK_SECRET", secret)  # read when the service starts
    with serving(Receiver(secret)) as hook:
        async with yoke.open(db_url, app=make_app(hook.url), **FAST) as y:
            assert [(r.name, r.outcome) for r in y.subscriptions_reconciled] == [("billing-hook", "created")]
            api = create_app(contextlib.nullcontext)  # the HTTP API of `yoke serve`, on this runtime
            serve_runtime(api, y)
            transport = httpx.ASGITransport(app=api)
            async with httpx.AsyncClient(transport=transport, base_url="http://billing") as http:
                yield Service(y, http, hook)


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 15.0) -> Any:
    """Poll ``check()`` until it returns something truthy (delivery runs in
    the background); return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s (last: {value!r})")
        await asyncio.sleep(0.02)


# --- the tests ------------------------------------------------------------------------------


async def test_a_month_of_billing_ends_in_one_signed_invoice(service: Service) -> None:
    y, hook = service.y, service.hook
    started = await service.post("evt-1", customer="c1", type="plan.started", plan="pro")
    assert started.status_code == 202, started.text
    # A retried POST (same key, same event) appends nothing new.
    again = await service.post("evt-1", customer="c1", type="plan.started", plan="pro")
    assert again.status_code == 202 and again.json() == started.json()
    for key, units in (("evt-2", 3), ("evt-3", 4)):
        answer = await service.post(key, customer="c1", type="usage.recorded", units=units)
        assert answer.status_code == 202, answer.text
    refused = await service.post("evt-4", customer="c1", type="plan.started", plan="platinum")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_input"
    await y.wait_idle(timeout_s=10)

    events = await y.stream("/customers/c1").read(0, limit=100)
    assert [e.type for e in events if not e.type.startswith("yoke.")] == ["plan.started", "usage.recorded",
                                                                         "usage.recorded"]
    # One instance for the customer, its own tables, and the monthly schedule.
    instances = y.instances("default")
    customer = await instances.find("customer", "c1")
    assert customer is not None
    usage = await instances.query(customer.instance_id, "SELECT units, invoice FROM usage ORDER BY at")
    assert usage.rows == [[3, None], [4, None]]
    (schedule,) = await instances.schedules(customer.instance_id)
    assert (schedule.name, schedule.cron) == ("close-period", "0 0 1 * *")
    due = datetime.fromtimestamp(schedule.due_at / 1000, UTC)
    assert (due.day, due.hour, due.minute) == (1, 0, 0) and due > datetime.now(UTC)

    # The month ends (the event the schedule sends on the 1st, sent now).
    closed = await service.post("close-1", customer="c1", type="billing.close_period")
    assert closed.status_code == 202
    await y.wait_idle(timeout_s=10)
    (invoice,) = await service.invoices()
    total = PLANS["pro"] + 7 * UNIT_PRICE_CENTS
    assert invoice.payload["invoice"] == "c1-0001" and invoice.payload["total_cents"] == total
    await y.stream("/invoices").wait_until_processed("billing-hook", invoice.offset, timeout_s=10)

    # Arrived once, signed (the receiver verified it), and it is that invoice.
    assert hook.answers == [204]
    (signed,) = hook.invoices.values()
    assert signed["name"] == "billing-hook" and signed["event"]["id"] == invoice.id
    assert signed["event"]["payload"]["total_cents"] == total
    rows = await instances.query(customer.instance_id, "SELECT number, total_cents FROM invoices")
    assert rows.rows == [[1, total]]
    usage = await instances.query(customer.instance_id, "SELECT count(*) FROM usage WHERE invoice = 1")
    assert usage.rows == [[2]]

    # Cancelling issues the final invoice (the plan's price, no usage) and
    # stops the schedule.
    await service.post("evt-5", customer="c1", type="plan.cancelled")
    await y.wait_idle(timeout_s=10)
    first, final = await service.invoices()
    assert final.payload["invoice"] == "c1-0002" and final.payload["total_cents"] == PLANS["pro"]
    assert await instances.schedules(customer.instance_id) == []
    await y.stream("/invoices").wait_until_processed("billing-hook", final.offset, timeout_s=10)
    assert len(hook.invoices) == 2


async def test_a_failing_receiver_halts_the_hook_and_a_replay_delivers_the_invoice_once(service: Service) -> None:
    y, hook = service.y, service.hook
    hook.broken = True  # the accounting system is down
    await service.post("evt-1", customer="c2", type="plan.started", plan="team")
    await service.post("close-1", customer="c2", type="billing.close_period")
    await y.wait_idle(timeout_s=10)
    (invoice,) = await service.invoices()

    # Retried on the (fast) ladder, then halted: a failure in the inbox.
    inbox = y.failures()
    (failure,) = await until(lambda: inbox.list(kind="halted"), "the halted webhook in the failures inbox")
    assert (failure.receiver, failure.subscription, failure.path) == ("webhook", "billing-hook", "/invoices")
    assert failure.offset == invoice.offset and failure.attempt_count == 15
    assert "answered 500" in failure.error
    assert hook.answers == [500] * 15 and hook.invoices == {}

    # Fixed; the replay resumes the subscription and delivers the invoice.
    hook.broken = False
    done = await inbox.replay(failure.id, wait=True, timeout_s=10)
    assert done.outcome.state == "done", done.outcome
    assert hook.answers[-1] == 204 and hook.answers.count(204) == 1
    (signed,) = hook.invoices.values()
    assert signed["event"]["id"] == invoice.id and signed["event"]["payload"]["total_cents"] == PLANS["team"]
    assert await inbox.list() == []
    status = await y.stream("/invoices").subscription("billing-hook")
    assert status.processed_through_offset >= invoice.offset


def test_the_module_reads_its_webhook_url_from_the_environment() -> None:
    # What `yoke serve --app examples.billing.app:app` imports, in a fresh
    # interpreter from the repository root.
    show = ("from examples.billing.app import app; (d,) = app.subscriptions.values();"
            " print(d.source, d.name, d.receiver.url)")
    env = {**os.environ, "BILLING_WEBHOOK_URL": "https://accounting.example.com/yoke"}
    done = subprocess.run([sys.executable, "-c", show], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["/invoices", "billing-hook", "https://accounting.example.com/yoke"]
