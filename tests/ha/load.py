"""The load a failover runs under, and the accounting afterwards.

Clients of a `yoke serve` running tests/ha/ha_app.py, as users write them:

- appenders: HTTP appends of ``order`` events to /orders, each with its own
  idempotency key, retried with the same key until acknowledged (a 503, a
  reset connection, a timeout: the outcome may be unknown, the key makes
  the retry safe);
- a Durable Streams producer (``Producer-Id``/``-Epoch``/``-Seq``) on
  /ha-ds, retrying a sequence number until it is accepted;
- an SSE tail of /orders that reconnects with ``Last-Event-ID``;
- a webhook receiver that verifies each delivery's signature.

``verify`` then reads everything back and checks what a failover must not
break; ``outage`` measures, from the acknowledgement times, how long no
append (or no actor run) went through around a moment."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson

from yoke.subscriptions.webhooks import verify as verify_signature

WEBHOOK_SECRET = "whsec_" + "aGEtdGVzdC1zZWNyZXQtb2YtMzItYnl0ZXMtLS0tLS0="
RETRY_S = 0.1  # a client's pause before it tries again (Yoke says Retry-After: 1; see outage())
KEYS = 100  # actor instances: payload.k takes this many values


class WebhookReceiver:
    """A receiver on 127.0.0.1 that records each verified delivery's order offset."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.bad = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    verify_signature(WEBHOOK_SECRET, {k.lower(): v for k, v in self.headers.items()}, body)
                    offset = orjson.loads(body)["event"]["offset"]
                except (ValueError, KeyError):
                    with receiver._lock:
                        receiver.bad += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.offsets.append(offset)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # close() does not wait for a handler a sender left hanging
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Load:
    base_url: str
    token: str
    appenders: int = 3
    pause_s: float = 0.02  # between one client's acknowledged appends
    acks: dict[str, int] = field(default_factory=dict)  # idempotency key -> offset
    ack_times: list[float] = field(default_factory=list)  # time.monotonic() of each ack
    ds_acked: list[int] = field(default_factory=list)  # producer sequence numbers accepted
    tail_offsets: list[int] = field(default_factory=list)
    tail_reconnects: int = 0
    failures: Counter = field(default_factory=Counter)  # what made clients retry
    unexpected: list[str] = field(default_factory=list)  # answers no failover may give
    _writers_left: int = 0

    def __post_init__(self) -> None:
        self.stopping = asyncio.Event()
        self.tail_until: int | None = None  # the tail ends once it saw this offset
        self.tail_done = asyncio.Event()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {self.token}"},
            timeout=httpx.Timeout(10.0),
        )

    def _failed(self, what: str, response: httpx.Response | None, exc: Exception | None = None) -> None:
        if response is None:
            self.failures[f"{what}: {type(exc).__name__}"] += 1
            return
        if response.status_code == 503:
            reason = ""
            try:
                reason = response.json()["error"].get("details", {}).get("reason", "")
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            self.failures[f"{what}: 503 {reason}".rstrip()] += 1
            return
        self.unexpected.append(f"{what}: {response.status_code} {response.text[:300]}")

    # --- the clients -----------------------------------------------------------

    async def run(self) -> None:
        """Until ``stop()``: then each client finishes what it has begun."""
        await asyncio.gather(
            *(self._appender(c) for c in range(self.appenders)), self._producer(), self._tail(),
        )

    async def stop(self) -> None:
        """Stop the writers (each sees its last request acknowledged), then
        let the tail read up to the last offset acknowledged."""
        self.stopping.set()
        deadline = time.monotonic() + 90
        while self._writers_left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._writers_left} writers still retrying after 90 s: failures "
                                   f"{dict(self.failures)}, unexpected answers {self.unexpected[-5:]}")
            await asyncio.sleep(0.05)
        self.tail_until = max(self.acks.values(), default=0)
        self.tail_done.set()

    async def _appender(self, c: int) -> None:
        self._writers_left += 1
        try:
            async with self.client() as http:
                seq = 0
                while not self.stopping.is_set():
                    key = f"c{c}-{seq}"
                    event = {"type": "order", "payload": {"k": f"k{(c * 37 + seq) % KEYS}", "client": c, "seq": seq}}
                    self.acks[key] = await self._append(http, key, event)
                    self.ack_times.append(time.monotonic())
                    seq += 1
                    await asyncio.sleep(self.pause_s)
        finally:
            self._writers_left -= 1

    async def _append(self, http: httpx.AsyncClient, key: str, event: dict) -> int:
        while True:
            response = None
            try:
                response = await http.post("/v1/streams/orders/-/events", json=event,
                                           headers={"Idempotency-Key": key})
                if response.status_code in (200, 201):
                    return response.json()["offset"]
                self._failed("append", response)
            except httpx.TransportError as exc:
                self._failed("append", None, exc)
            await asyncio.sleep(RETRY_S)

    async def _producer(self) -> None:
        self._writers_left += 1
        try:
            async with self.client() as http:
                while True:
                    try:
                        made = await http.put("/v1/stream/ha-ds", headers={"Content-Type": "application/json"})
                        if made.status_code in (200, 201):
                            break
                        self._failed("ds create", made)
                    except httpx.TransportError as exc:
                        self._failed("ds create", None, exc)
                    await asyncio.sleep(RETRY_S)
                seq = 0
                while not self.stopping.is_set():
                    if not await self._produce(http, seq):
                        break  # refused for good (unexpected): retrying would not help
                    self.ds_acked.append(seq)
                    seq += 1
                    await asyncio.sleep(self.pause_s * 2)
        finally:
            self._writers_left -= 1

    async def _produce(self, http: httpx.AsyncClient, seq: int) -> bool:
        """Until ``seq`` is accepted (True), or refused for good (False: a 4xx;
        an asynchronous standby that lost accepted requests answers 409 gap)."""
        headers = {"Content-Type": "application/json", "Producer-Id": "ha-producer",
                   "Producer-Epoch": "0", "Producer-Seq": str(seq)}
        while True:
            response = None
            try:
                response = await http.post("/v1/stream/ha-ds", content=orjson.dumps([{"seq": seq}]),
                                           headers=headers)
                # 200: accepted; 204: a repeat of an accepted request (its first try
                # was committed, but the answer was lost).
                if response.status_code in (200, 204):
                    return True
                self._failed("ds append", response)
                if 400 <= response.status_code < 500 and response.status_code != 429:
                    return False
            except httpx.TransportError as exc:
                self._failed("ds append", None, exc)
            await asyncio.sleep(RETRY_S)

    async def _tail(self) -> None:
        last = 0
        async with self.client() as http:
            while not (self.tail_done.is_set() and last >= (self.tail_until or 0)):
                try:
                    headers = {"Last-Event-ID": str(last)} if last else {}
                    async with http.stream("GET", "/v1/streams/orders/-/tail", headers=headers,
                                           timeout=httpx.Timeout(10.0, read=5.0)) as response:
                        if response.status_code != 200:
                            await response.aread()
                            if response.status_code != 404:  # /orders not made yet
                                self._failed("tail", response)
                            await asyncio.sleep(RETRY_S)
                            continue
                        async for line in response.aiter_lines():
                            if line.startswith("id: "):
                                last = int(line[4:])
                                self.tail_offsets.append(last)
                            if self.tail_done.is_set() and last >= (self.tail_until or 0):
                                return
                except httpx.TransportError as exc:  # a read timeout included
                    self.failures[f"tail: {type(exc).__name__}"] += 1
                self.tail_reconnects += 1
                await asyncio.sleep(RETRY_S)

    # --- measuring -----------------------------------------------------------------

    def outage(self, at: float, until: float) -> float:
        """The longest time without an acknowledged append between ``at`` and
        ``until`` (time.monotonic() values; the first wait counted from
        ``at``): what a client retrying every RETRY_S saw of a fault at ``at``."""
        return longest_gap(self.ack_times, at, until)


def longest_gap(times: list[float], at: float, until: float) -> float:
    """The longest interval with no entry of ``times`` between ``at`` and
    ``until`` (the first measured from ``at`` itself)."""
    inside = sorted(t for t in times if at <= t <= until)
    if not inside:
        return float("inf")
    gaps = [inside[0] - at] + [b - a for a, b in zip(inside, inside[1:], strict=False)]
    return max(gaps)


# --- reading it all back --------------------------------------------------------------


async def read_all(http: httpx.AsyncClient, path: str) -> list[dict]:
    events: list[dict] = []
    after = 0
    while True:
        response = await http.get(f"/v1/streams{path}/-/events", params={"after": after, "limit": 10_000})
        if response.status_code == 404:
            return events
        response.raise_for_status()
        page = response.json()
        if not page["events"]:
            return events
        events.extend(page["events"])
        after = page["next_after"]


@dataclass
class Outcome:
    offsets: list[int]  # every event of /orders (the subscriptions' configure events too)
    orders: list[int]  # the offsets of its ``order`` events
    counted: list[int]  # the order offsets /counted names, in its order
    copied: list[int]  # the source offsets of /orders-copy, in its order
    ds: list[int]  # the producer's sequence numbers on /ha-ds, in order
    runs: int  # actor runs counted in the instances' state (repeats included)
    lost: dict[str, int]  # acknowledged appends missing (key -> acknowledged offset)


async def collect(load: Load, *, strict: bool = True) -> Outcome:
    """Read everything back. ``strict``: assert that no acknowledged append
    is lost (a synchronous standby); else count what is (an asynchronous one)."""
    async with load.client() as http:
        stream = await read_all(http, "/orders")
        counted = [e["payload"]["order"] for e in await read_all(http, "/counted")]
        copied = [e["source"]["copied_from"][-1]["offset"] for e in await read_all(http, "/orders-copy")]
        ds = [e["payload"]["seq"] for e in await read_all(http, "/ha-ds")]
        runs = 0
        listed = (await http.get("/v1/instances", params={"actor": "counter", "limit": 1000})).json()
        for instance in listed["instances"]:
            state = (await http.get(f"/v1/instances/{instance['id']}")).json()["state"]["value"] or {}
            runs += state.get("runs", 0)
    orders = [e for e in stream if e["type"] == "order"]
    # Every acknowledged key once, at its acknowledged offset: nothing lost
    # (RPO 0), nothing doubled by a retry.
    by_key = {e["idempotency_key"]: e["offset"] for e in orders}
    twice = Counter(e["idempotency_key"] for e in orders) - Counter(by_key.keys())
    assert not twice, f"idempotency keys appended twice: {[e for e in orders if e['idempotency_key'] in twice][:6]}"
    lost = {k: o for k, o in load.acks.items() if by_key.get(k) != o}
    offsets = [e["offset"] for e in stream]
    if strict:
        assert not lost, f"{len(lost)} acknowledged appends lost or moved, e.g. {list(lost.items())[:5]}"
        assert len(orders) == len(load.acks), f"{len(orders) - len(load.acks)} appended but never acknowledged"
        assert offsets == list(range(1, len(stream) + 1))
    return Outcome(offsets, [e["offset"] for e in orders], counted, copied, ds, runs, lost)
