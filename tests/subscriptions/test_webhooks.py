"""Webhook subscriptions against a real HTTP receiver.

Every test runs on SQLite and PostgreSQL, each in a database of its own
(``fresh_url``: a delivery engine claims every subscription of its database).
The receiver (``webhook_server.WebhookReceiver``) is an HTTP/1.1 server on
127.0.0.1; each request it records is checked with the reference Standard
Webhooks verifier and with ``yoke.subscriptions.webhooks.verify``.

The retry clock is made fast with the settings (no test sleeps to wait for a
delivery: tests wait on the receiver's condition or poll the subscription row).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

import orjson
import pytest

import yoke
from yoke import errors
from yoke.subscriptions.receivers import Webhook, from_dict, secret_id
from yoke.subscriptions.webhooks import verify

from .webhook_server import Request, Response, WebhookReceiver, check_signed, eventually

REPO_ROOT = Path(__file__).resolve().parents[2]
PATH = "/orders/eu"
FAST = {
    "subscription_retry_base_s": 0.01,
    "subscription_retry_max_s": 0.05,
    "subscription_sweep_s": 0.1,
}


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


async def stream_id_of(s: yoke.Stream) -> str:
    return (await s.info()).stream_id


def events(n: int, kind: str = "order.placed", start: int = 0) -> list[dict]:
    return [
        {"type": kind, "payload": {"n": i, "text": "café ✓"}, "metadata": {"seq": str(i)}}
        for i in range(start, start + n)
    ]


# --- signing, headers and body -------------------------------------------------------


async def test_each_event_is_one_signed_post(fresh_url: str, tenant: str) -> None:
    secret = new_secret()
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.append({"type": "before", "payload": {}})  # before a start="now" subscription
        sub = await s.subscribe("hook", yoke.webhook(hook.url, secret=secret))
        assert sub.created and sub.name == "hook"
        assert sub.secret is None  # a secret the caller gave is not echoed back
        appended = await s.append_many(events(5))
        await s.wait_until_processed("hook", appended[-1].offset, timeout_s=10)

        stream_id = await stream_id_of(s)
        stored = {e.offset: e for e in await s.read(0)}
        assert hook.offsets() == [r.offset for r in appended]  # one POST per event, in order
        for request in hook.requests:
            body = check_signed(request, secret, stream_id, PATH, "hook")
            assert body["attempt"] == 1
            assert body["event"] == stored[request.offset].to_dict()
            assert request.target == "/hook"
        status = await s.subscription("hook")
        assert status.processed_through_offset == appended[-1].offset
        assert (status.delivered, status.failures, status.attempts) == (5, 0, 0)
        assert status.halted is None and status.next_retry_at is None


async def test_generated_secret_is_returned_once_and_signs(fresh_url: str, tenant: str) -> None:
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        receiver = yoke.webhook(hook.url)
        first = await s.subscribe("hook", receiver)
        assert first.created and first.secret is not None and first.secret.startswith("whsec_")
        assert 24 <= len(base64.b64decode(first.secret[len("whsec_"):])) <= 64
        # The same configuration again: nothing appended, the secret not shown again.
        again = await s.subscribe("hook", receiver)
        assert (again.created, again.offset, again.secret) == (False, first.offset, None)

        appended = await s.append_many(events(3))
        await s.wait_until_processed("hook", appended[-1].offset, timeout_s=10)
        stream_id = await stream_id_of(s)
        assert hook.offsets() == [r.offset for r in appended]
        for request in hook.requests:
            check_signed(request, first.secret, stream_id, PATH, "hook")

        # The secret stays out of the log and the status: the configure event
        # carries its fingerprint only.
        log = await s.read(0)
        assert first.secret not in orjson.dumps([e.to_dict() for e in log]).decode()
        configured = next(e for e in log if e.offset == first.offset)
        assert configured.type == "yoke.subscription.configured"
        assert configured.payload["config"]["secret_id"] == secret_id(first.secret)
        assert "secret" not in configured.payload["config"]
        status = await s.subscription("hook")
        assert first.secret not in orjson.dumps(status.to_dict(), default=str).decode()

        # A new generated secret replaces the subscription; later POSTs are
        # signed with the new secret, which is shown once, too.
        replaced = await s.subscribe("hook", yoke.webhook(hook.url))
        assert replaced.created and replaced.secret not in (None, first.secret)
        more = await s.append_many(events(2, start=3))
        await s.wait_until_processed("hook", more[-1].offset, timeout_s=10)
        later = [r for r in hook.requests if r.offset > replaced.offset]
        assert [r.offset for r in later] == [r.offset for r in more]
        for request in later:
            check_signed(request, replaced.secret, stream_id, PATH, "hook")
            with pytest.raises(ValueError):
                verify(first.secret, request.headers, request.body)


# --- acknowledgement, retries, Retry-After ------------------------------------------------


async def test_any_2xx_acknowledges(fresh_url: str, tenant: str) -> None:
    answers = [
        Response(200, [("content-type", "application/json")], b'{"ignored": true}'),
        Response(201),
        Response(202, body=b"queued"),
        Response(204),
        Response(299),
    ]
    count = 0

    def respond(request: Request) -> Response:
        nonlocal count
        count += 1
        return answers[(count - 1) % len(answers)]

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret))
        appended = await s.append_many(events(5))
        await s.wait_until_processed("hook", appended[-1].offset, timeout_s=10)
        assert hook.offsets() == [r.offset for r in appended]  # no retries
        assert [r.status for r in hook.requests] == [200, 201, 202, 204, 299]
        assert all(r.attempt == 1 for r in hook.requests)
        status = await s.subscription("hook")
        assert (status.delivered, status.failures, status.attempts) == (5, 0, 0)


async def test_500_is_retried_with_the_attempt_incremented(fresh_url: str, tenant: str) -> None:
    failing = True
    target = 0

    def respond(request: Request) -> Response | int:
        if failing and request.offset == target:
            return Response(500, [("content-type", "application/json")],
                            b'{"error":\n  "ledger is down"}' + b" " * 5000 + b"the end")
        return 204

    secret = new_secret()
    # A slower ladder than FAST (15 attempts take ~1.3 s): the test stops
    # failing long before the halt.
    settings = {**FAST, "subscription_retry_base_s": 0.02, "subscription_retry_max_s": 0.1}
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **settings) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret))
        e1, e2, e3 = [r.offset for r in await s.append_many(events(3))]
        target = e2
        # (e1 may be delivered before target is set: it answers 204 either way.)
        await hook.wait_for(lambda rs: len([r for r in rs if r.offset == e2 and r.status == 500]) >= 3)

        async def failing_row():
            st = await s.subscription("hook")
            return st if st.attempts >= 3 else None

        status = await eventually(failing_row, what="three failed attempts recorded")
        assert status.processed_through_offset == e1  # the cursor stays before the failing event
        # The evidence: the status, how long it took, the answer's start on one line, bounded.
        assert re.fullmatch(r'WebhookFailed: POST \S+ answered 500 in \d+ ms: \{"error": "ledger is down"\}', status.last_error), \
            status.last_error
        assert status.next_retry_at is not None and status.halted is None
        assert e3 not in hook.offsets()  # nothing overtakes the failing event

        failing = False
        await s.wait_until_processed("hook", e3, timeout_s=10)
        tries = hook.for_offset(e2)
        assert [r.attempt for r in tries] == list(range(1, len(tries) + 1))
        assert [r.status for r in tries] == [500] * (len(tries) - 1) + [204]
        assert len({r.msg_id for r in tries}) == 1 and len({orjson.dumps(r.event) for r in tries}) == 1
        stream_id = await stream_id_of(s)
        for request in hook.requests:
            check_signed(request, secret, stream_id, PATH, "hook")
        assert [r.attempt for r in hook.for_offset(e3)] == [1]  # the ladder restarts after an ack
        status = await s.subscription("hook")
        assert status.attempts == 0 and status.failures == len(tries) - 1
        assert status.processed_through_offset == e3 and status.next_retry_at is None


async def test_retry_after_is_honoured_for_429_and_503_only(fresh_url: str, tenant: str) -> None:
    """A 429 or 503 with Retry-After sets the next attempt's delay (not the
    ~10-60 ms ladder); a 500 with Retry-After is an ordinary failure."""
    plan: dict[int, Callable[[], Response]] = {}

    def respond(request: Request) -> Response:
        if len(hook.for_offset(request.offset)) == 1 and request.offset in plan:
            return plan[request.offset]()
        return Response(204)

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe("hook", yoke.webhook(hook.url, secret))
        a, b, c = sub.offset + 1, sub.offset + 2, sub.offset + 3
        plan[a] = lambda: Response(429, [("retry-after", "1")])
        plan[b] = lambda: Response(503, [("retry-after", formatdate(time.time() + 2, usegmt=True))])
        plan[c] = lambda: Response(500, [("retry-after", "30")])
        assert [r.offset for r in await s.append_many(events(3))] == [a, b, c]

        async def retry_pending(offset: int):
            async def check():
                st = await s.subscription("hook")
                return st if st.attempts == 1 and st.processed_through_offset == offset - 1 else None
            return await eventually(check, what=f"a pending retry of {offset}")

        # 429, Retry-After: 1 (delta seconds).
        status = await retry_pending(a)
        first = hook.for_offset(a)[0]
        assert first.status == 429 and "429" in status.last_error
        delay_ms = status.next_retry_at - first.responded * 1000
        assert 900 <= delay_ms <= 1500, delay_ms
        retried = await hook.wait_for(lambda rs: [r for r in rs if r.offset == a][1:])
        assert retried[0].received - first.responded >= 0.9
        assert retried[0].attempt == 2

        # 503, Retry-After as an HTTP date ~2 s ahead (whole seconds: 1-2 s from the answer).
        status = await retry_pending(b)
        first = hook.for_offset(b)[0]
        assert first.status == 503
        delay_ms = status.next_retry_at - first.responded * 1000
        assert 900 <= delay_ms <= 2500, delay_ms
        retried = await hook.wait_for(lambda rs: [r for r in rs if r.offset == b][1:])
        assert retried[0].received - first.responded >= 0.9

        # 500 with Retry-After: 30 follows the (fast) ladder instead.
        retried = await hook.wait_for(lambda rs: [r for r in rs if r.offset == c][1:], timeout_s=5)
        first = hook.for_offset(c)[0]
        assert first.status == 500
        assert retried[0].received - first.responded < 0.5
        await s.wait_until_processed("hook", c, timeout_s=10)
        assert [r.offset for r in hook.requests] == [a, a, b, b, c, c]


async def test_deliveries_reuse_one_kept_alive_connection(fresh_url: str, tenant: str) -> None:
    """One POST per event, not one TCP connection per event: an answer's
    small body is read to its end, so the connection goes back to the pool.
    Found by bench/soak.py: 4,602 POSTs arrived on 4,602 connections (a
    TIME_WAIT socket per event on the sender, a TLS handshake per event on
    https, the sender's ephemeral ports spent at ~470 events/s)."""
    answers = [
        Response(204),
        Response(200, [("content-type", "application/json")], b'{"ok": true}'),
        Response(202, body=b"queued"),
    ]
    count = 0

    def respond(request: Request) -> Response:
        nonlocal count
        count += 1
        return answers[(count - 1) % len(answers)]

    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, new_secret()))
        appended = await s.append_many(events(9))
        await s.wait_until_processed("hook", appended[-1].offset, timeout_s=10)
        assert hook.offsets() == [r.offset for r in appended]  # no retries
        assert hook.connections == 1


async def test_an_answer_body_that_never_ends_does_not_hold_deliveries(fresh_url: str, tenant: str) -> None:
    """The status decides: a 2xx whose body never arrives in full still
    acknowledges its event, at once rather than at the timeout; the body is
    abandoned (with its connection) after a short bounded wait."""
    posts = 0

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal posts
        try:
            while True:
                length = 0
                if not await reader.readline():
                    return
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                posts += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nthe rest never comes")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        async with yoke.open(fresh_url, subscription_timeout_s=30, **FAST) as y:
            s = y.stream(PATH, tenant)
            await s.subscribe("hook", yoke.webhook(url, new_secret()))
            appended = await s.append_many(events(3))
            started = time.monotonic()
            status = await s.wait_until_processed("hook", appended[-1].offset, timeout_s=20)
            assert time.monotonic() - started < 5  # not 3 x the 30 s timeout
            assert (status.delivered, status.failures) == (3, 0)
            assert posts == 3
    finally:
        server.close()
        await server.wait_closed()


async def test_other_answers_are_failures(fresh_url: str, tenant: str) -> None:
    """Only a 2xx acknowledges: a redirect (not followed), 4xx and 5xx are
    failures, retried at the same offset with the next attempt number."""
    plan: dict[int, int] = {}

    def respond(request: Request) -> int:
        if len(hook.for_offset(request.offset)) == 1:
            return plan.get(request.offset, 204)
        return 204

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe("hook", yoke.webhook(hook.url, secret))
        statuses = [302, 400, 404, 410, 502]
        for i, code in enumerate(statuses):
            plan[sub.offset + 1 + i] = code
        offsets = [r.offset for r in await s.append_many(events(len(statuses)))]
        await s.wait_until_processed("hook", offsets[-1], timeout_s=10)
        for offset, code in zip(offsets, statuses):
            tries = hook.for_offset(offset)
            assert [(r.attempt, r.status) for r in tries] == [(1, code), (2, 204)], (offset, code)
        status = await s.subscription("hook")
        assert status.failures == len(statuses) and status.delivered == len(statuses)


async def test_no_answer_within_the_timeout_is_a_failure(fresh_url: str, tenant: str) -> None:
    release = asyncio.Event()

    async def respond(request: Request) -> int:
        if request.attempt == 1:
            await release.wait()  # answers only after the sender gave up
        return 204

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, subscription_timeout_s=0.3, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret))
        offset = (await s.append({"type": "slow", "payload": {}})).offset
        await hook.wait_for(lambda rs: len(rs) >= 2)  # attempt 2 while attempt 1 still waits
        release.set()
        status = await s.wait_until_processed("hook", offset, timeout_s=10)
        tries = hook.for_offset(offset)
        assert [r.attempt for r in tries][:2] == [1, 2]
        assert tries[1].received - tries[0].received >= 0.25
        assert status.failures >= 1


async def test_a_failing_transform_is_a_delivery_failure(fresh_url: str, tenant: str) -> None:
    """A transform that fails on one event (here: it yields a number, not an
    object) is an ordinary delivery failure: with on_failing_event="skip"
    that event is skipped with an audit line, its neighbours are POSTed."""
    secret = new_secret()
    transform = 'payload.bad ? 42 : {"payload": {"ok": payload.n}}'
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret), transform=transform, on_failing_event="skip")
        offsets = [r.offset for r in await s.append_many([
            {"type": "t", "payload": {"n": 1}},
            {"type": "t", "payload": {"n": 2, "bad": True}},
            {"type": "t", "payload": {"n": 3}},
        ])]
        await s.wait_until_processed("hook", offsets[-1], timeout_s=10)
        posted = [r for r in hook.requests if r.offset in offsets]
        assert [(r.offset, r.event["payload"]) for r in posted] == [
            (offsets[0], {"ok": 1}), (offsets[2], {"ok": 3}),
        ]
        audit = [e for e in await s.read(offsets[-1]) if e.type == "yoke.error"]
        assert [(e.payload["kind"], e.payload["offset"]) for e in audit] == [
            ("subscription_event_skipped", offsets[1]),
        ]
        assert "InvalidTransform" in audit[0].payload["error"]


# --- transform, filter, ephemeral -------------------------------------------------------------


async def test_transform_reshapes_the_posted_event_not_its_coordinates(fresh_url: str, tenant: str) -> None:
    secret = new_secret()
    transform = '{"type": "shaped." & type, "payload": {"doubled": payload.n * 2, "was": type}}'
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret), transform=transform)
        appended = await s.append_many(events(3, start=1))
        await s.wait_until_processed("hook", appended[-1].offset, timeout_s=10)
        stream_id = await stream_id_of(s)
        stored = {e.offset: e for e in await s.read(0)}
        assert hook.offsets() == [r.offset for r in appended]
        for request in hook.requests:
            body = check_signed(request, secret, stream_id, PATH, "hook")
            source = stored[request.offset].to_dict()
            posted = body["event"]
            assert posted["type"] == "shaped.order.placed"
            assert posted["payload"] == {"doubled": source["payload"]["n"] * 2, "was": "order.placed"}
            assert posted["metadata"] == source["metadata"]  # omitted by the transform: verbatim
            for coordinate in ("offset", "id", "at", "path", "tenant", "source", "correlation"):
                assert posted[coordinate] == source[coordinate], coordinate
            assert request.msg_id == f"{stream_id}:{source['offset']}"


async def test_filter_advances_the_cursor_without_posts(fresh_url: str, tenant: str) -> None:
    secret = new_secret()
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe(
            "hook", yoke.webhook(hook.url, secret),
            filter={"types": ["keep.*"], "where": "payload.n >= 2"},
        )
        # Nothing matches: the cursor still moves past every event, with no POST.
        skipped = await s.append_many(events(3, kind="other.thing"))
        status = await s.wait_until_processed("hook", skipped[-1].offset, timeout_s=10)
        assert status.processed_through_offset == skipped[-1].offset
        assert hook.requests == []

        batch = [
            {"type": "keep.a", "payload": {"n": 1}},  # type matches, where does not
            {"type": "keep.b", "payload": {"n": 2}},
            {"type": "other.thing", "payload": {"n": 5}},
            {"type": "keep.c", "payload": {"n": 3}},
            {"type": "keepsake", "payload": {"n": 9}},  # not under keep.
            {"type": "other.thing", "payload": {"n": 7}},
        ]
        offsets = [r.offset for r in await s.append_many(batch)]
        status = await s.wait_until_processed("hook", offsets[-1], timeout_s=10)
        assert status.processed_through_offset == offsets[-1]
        assert hook.offsets() == [offsets[1], offsets[3]]
        assert [r.event["type"] for r in hook.requests] == ["keep.b", "keep.c"]
        assert status.delivered == 2


async def test_ephemeral_events_are_never_posted(fresh_url: str, tenant: str) -> None:
    secret = new_secret()
    async with WebhookReceiver() as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("hook", yoke.webhook(hook.url, secret))
        durable, ephemeral = [], []
        for i, flag in enumerate([False, True, True, False, True, False, True]):
            r = await s.append({"type": "chunk" if flag else "done", "payload": {"i": i}, "ephemeral": flag})
            (ephemeral if flag else durable).append(r.offset)
        # The trailing ephemeral offset is passed too.
        status = await s.wait_until_processed("hook", ephemeral[-1], timeout_s=10)
        assert status.processed_through_offset == ephemeral[-1]
        assert hook.offsets() == durable
        assert all(not r.event["ephemeral"] and r.event["type"] == "done" for r in hook.requests)


# --- configure-time refusals ----------------------------------------------------------------


BAD_URLS = [
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "ws://127.0.0.1/hook",
    "http://",
    "example.com/hook",
    "//example.com/hook",
    "",
]


@pytest.mark.parametrize("url", BAD_URLS)
async def test_a_non_http_url_is_refused_with_nothing_appended(fresh_url: str, tenant: str, url: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        head = (await s.append({"type": "x"})).offset
        with pytest.raises(errors.InvalidInput) as refused:
            await s.subscribe("hook", yoke.webhook(url))
        assert refused.value.code == "invalid_input"
        with pytest.raises(errors.InvalidInput):  # the JSON form (HTTP, CLI) too
            await s.subscribe("hook", from_dict({"kind": "webhook", "url": url}))
        assert (await s.info()).head == head
        assert await s.subscriptions() == []
        # and on a stream that does not exist yet: it is not created
        with pytest.raises(errors.InvalidInput):
            await y.stream("/never", tenant).subscribe("hook", yoke.webhook(url))
        assert await y.store.info(tenant, "/never") is None


async def test_a_bad_secret_is_refused(fresh_url: str, tenant: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        head = (await s.append({"type": "x"})).offset
        for secret in ["not-a-secret", "whsec_", "whsec_!!!!", "whsec_" + base64.b64encode(b"short").decode()]:
            with pytest.raises(errors.InvalidInput):
                await s.subscribe("hook", yoke.webhook("https://example.com/hook", secret=secret))
        assert (await s.info()).head == head and await s.subscriptions() == []


async def test_subscribe_itself_refuses_a_non_http_webhook(fresh_url: str, tenant: str) -> None:
    """The check is made when the subscription is configured, not only by
    the ``webhook()`` helper: a receiver built another way is refused too."""
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        head = (await s.append({"type": "x"})).offset
        with pytest.raises(errors.InvalidInput):
            await s.subscribe("hook", Webhook("file:///etc/passwd", new_secret()))
        assert (await s.info()).head == head and await s.subscriptions() == []


# --- halts and skips ----------------------------------------------------------------------------


async def test_halt_after_the_retry_ladder(fresh_url: str, tenant: str) -> None:
    broken = True
    target = 0

    def respond(request: Request) -> int:
        return 500 if broken and request.offset == target else 204

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, deploy_version="v-test", **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe("hook", yoke.webhook(hook.url, secret))
        target = sub.offset + 2
        e1, e2, e3 = [r.offset for r in await s.append_many(events(3))]
        assert e2 == target

        async def halted():
            st = await s.subscription("hook")
            return st if st.halted is not None else None

        status = await eventually(halted, what="the halt")
        tries = hook.for_offset(e2)
        assert [r.attempt for r in tries] == list(range(1, 16))  # 15 attempts, no 16th
        assert all(r.status == 500 for r in tries)
        assert e3 not in hook.offsets()
        assert status.processed_through_offset == e1
        assert status.next_retry_at is None
        halt = status.halted
        assert (halt["offset"], halt["attempts"], halt["version"]) == (e2, 15, "v-test")
        assert "500" in halt["error"]

        log = await s.read(e3)
        halted_events = [e for e in log if e.type == "yoke.subscription.halted"]
        assert len(halted_events) == 1
        event = halted_events[0]
        assert event.payload == {
            "name": "hook", "offset": e2, "attempts": 15, "error": halt["error"], "version": "v-test",
        }
        assert halt["at_offset"] == event.offset

        # The operator resumes once the receiver is fixed: delivery restarts at
        # the failing event with a fresh ladder.
        broken = False
        await s.resume("hook")
        head = (await s.info()).head
        await s.wait_until_processed("hook", head, timeout_s=10)
        assert hook.for_offset(e2)[-1].attempt == 1 and hook.for_offset(e2)[-1].status == 204
        assert [r.attempt for r in hook.for_offset(e3)] == [1]
        assert (await s.subscription("hook")).halted is None


async def test_a_halt_resumes_once_under_a_new_deploy_version(fresh_url: str, tenant: str) -> None:
    broken = True

    def respond(request: Request) -> int:
        return 500 if broken else 204

    secret = new_secret()
    async with WebhookReceiver(respond) as hook:
        async with yoke.open(fresh_url, deploy_version="v1", **FAST) as y:
            s = y.stream(PATH, tenant)
            await s.subscribe("hook", yoke.webhook(hook.url, secret))
            e1 = (await s.append({"type": "a", "payload": {}})).offset

            async def halted():
                st = await s.subscription("hook")
                return st if st.halted is not None else None

            status = await eventually(halted, what="the halt")
            assert status.halted["version"] == "v1" and status.halted["offset"] == e1
        broken = False  # "the fix is deployed"
        async with yoke.open(fresh_url, deploy_version="v2", **FAST) as y:
            s = y.stream(PATH, tenant)
            await s.wait_until_processed("hook", e1, timeout_s=10)
            resumed = [e for e in await s.read(0) if e.type == "yoke.subscription.resumed"]
            assert [e.payload for e in resumed] == [{"name": "hook", "reason": "deploy", "version": "v2"}]
            assert hook.for_offset(e1)[-1].status == 204
            assert (await s.subscription("hook")).halted is None


async def test_skip_a_poison_event_with_an_audit_line(fresh_url: str, tenant: str) -> None:
    poison = 0

    def respond(request: Request) -> int:
        return 500 if request.offset == poison else 204

    secret = new_secret()
    async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        sub = await s.subscribe("hook", yoke.webhook(hook.url, secret), on_failing_event="skip")
        poison = sub.offset + 3
        offsets = [r.offset for r in await s.append_many(events(5))]
        assert offsets[2] == poison
        status = await s.wait_until_processed("hook", offsets[-1], timeout_s=10)
        assert status.halted is None

        tries = hook.for_offset(poison)
        assert [r.attempt for r in tries] == [1, 2, 3] and all(r.status == 500 for r in tries)
        neighbours = [o for o in offsets if o != poison]
        for o in neighbours:
            assert [(r.attempt, r.status) for r in hook.for_offset(o)] == [(1, 204)], o
        firsts = list(dict.fromkeys(o for o in hook.offsets() if o in offsets))
        assert firsts == offsets  # in order; the skip happened in place

        audit = [e for e in await s.read(offsets[-1]) if e.type == "yoke.error"]
        assert len(audit) == 1
        payload = audit[0].payload
        assert payload["kind"] == "subscription_event_skipped"
        assert (payload["name"], payload["offset"], payload["attempts"]) == ("hook", poison, 3)
        assert "500" in payload["error"]
        stream_id = await stream_id_of(s)
        for request in hook.requests:
            check_signed(request, secret, stream_id, PATH, "hook")


# --- the sender killed mid-run ------------------------------------------------------------------

SENDER = """
import asyncio, sys
import yoke

async def main() -> None:
    async with yoke.open(sys.argv[1]):
        print("serving", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def check_at_least_once_in_order(seen: list[int], expected: list[int]) -> None:
    """Every expected offset at least once; first occurrences ascending; a
    redelivery only ever restarts at or before the point reached (never
    skips ahead), and between restarts offsets follow one another."""
    position = {o: i for i, o in enumerate(expected)}
    assert set(seen) == set(expected), sorted(set(expected) - set(seen))
    assert list(dict.fromkeys(seen)) == expected
    reached = -1
    previous = None
    for offset in seen:
        p = position[offset]
        assert p <= reached + 1, f"{offset} delivered before {expected[reached + 1]}"
        if previous is not None and p != previous + 1:
            assert p <= previous, f"{offset} follows {expected[previous]}"
        reached = max(reached, p)
        previous = p


async def test_sender_killed_and_restarted_mid_run(fresh_url: str, tenant: str, tmp_path) -> None:
    """200 events; the sending process is SIGKILLed while it waits for the
    answer to one of them; a new process takes the lease over (short lease)
    and resumes right after processed_through_offset."""
    secret = new_secret()
    released = asyncio.Event()  # set after the kill
    hold_at = 0

    async def respond(request: Request) -> int:
        if request.offset == hold_at and len(hook.for_offset(hold_at)) == 1:
            await released.wait()  # in flight when the sender dies
        return 204

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "YOKE_SUBSCRIPTION_LEASE_S": "1",
        "YOKE_SUBSCRIPTION_SWEEP_S": "0.05",
        "YOKE_SUBSCRIPTION_RETRY_BASE_S": "0.01",
        "YOKE_SUBSCRIPTION_RETRY_MAX_S": "0.05",
        "YOKE_DATA_DIR": str(tmp_path / "sender-data"),
    }
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(n: int) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"sender-{n}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-c", SENDER, fresh_url], env=env, cwd=tmp_path,
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        procs.append(proc)
        return proc

    try:
        async with WebhookReceiver(respond) as hook, yoke.open(fresh_url, executor=False) as y:
            s = y.stream(PATH, tenant)
            sub = await s.subscribe("hook", yoke.webhook(hook.url, secret))
            appended = [r.offset for r in await s.append_many(events(200))]
            hold_at = appended[150]

            first = spawn(1)
            await hook.wait_for(lambda rs: any(r.offset == hold_at for r in rs), timeout_s=30)
            first.send_signal(signal.SIGKILL)
            first.wait()
            at_kill = await s.subscription("hook")
            cursor = at_kill.processed_through_offset
            assert sub.offset < cursor < hold_at  # acknowledged progress, but not the held event
            before_restart = len(hook.requests)
            released.set()

            spawn(2)
            await s.wait_until_processed("hook", appended[-1], timeout_s=30)

            seen = hook.offsets()
            check_at_least_once_in_order(seen, appended)
            resumed = seen[before_restart:]
            assert resumed[0] == cursor + 1  # resumes right after processed_through_offset
            assert len(hook.for_offset(hold_at)) >= 2  # the unacknowledged event is sent again
            stream_id = await stream_id_of(s)
            for request in hook.requests:
                check_signed(request, secret, stream_id, PATH, "hook")
            status = await s.subscription("hook")
            assert status.processed_through_offset == appended[-1] and status.halted is None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
