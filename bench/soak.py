#!/usr/bin/env python
"""Soak: steady mixed load against a real ``yoke serve`` for ``--minutes``,
the server's resources sampled, every delivery checked at the end.

Per backend (``--backend sqlite|postgres|both``), a ``yoke serve --app
soak_app:app`` subprocess (bench/soak_app.py: a keyed actor doing
``ctx.state.update``; YOKE_ACCESS_LOG=0, bearer token auth) gets, on one
stream ``/soak-main``, at steady configurable rates, for ``--minutes``:

- single appends (``POST /v1/streams/soak-main/-/events``, one event each)
  by ``--producers`` connections, ``--single-rate`` events/s in all;
- batches of ``--batch-size`` events at ``--batch-rate`` batches/s;
- ``soak.work`` events for the actor at ``--actor-rate``/s, over
  ``--actor-keys`` keys, each with its key's sequence number;

and it is read, from its first event, by

- ``--tails`` SSE tails (``/-/tail``), each reconnecting with
  ``Last-Event-ID`` after a random 0.5-1.5 x ``--tail-churn-s``;
- ``--ds-readers`` Durable Streams readers on ``/v1/stream/soak-main``, a
  third each catch-up polls (every ``--ds-poll-s``), long-polls and SSE
  (which the server ends every 60 s; the reader reconnects from its offset);
- a copy subscription into ``/soak-copy`` and a webhook subscription to a
  receiver this script runs on 127.0.0.1 (signatures checked), both for the
  ``soak.*`` events;
- the actor, through fan-out: one instance per key.

Every ``--sample-s`` (10) seconds a row is printed: the server's RSS, open
files (/proc/PID/fd), CPU, database connections (pg_stat_activity for its
database; SQLite: -), the actor queue (pending + processing), fan-out lag
and the subscriptions' lag (``GET /v1/overview``), how far behind the head
the slowest tail, DS reader and webhook are, errors so far and the load
average.

Then the load stops; once every consumer has caught up (at most
``--drain-s``), the stream is read back over HTTP as the reference and:

- every acknowledged append is there once, at the offset it was answered,
  in each producer's order;
- each tail and DS reader received exactly the stream, in order (offsets
  and a digest of ids / messages): no gap, no duplicate;
- the copy target holds each ``soak.*`` event once, in order, same content;
- the webhook receiver got each ``soak.*`` event (deduplicated by its
  ``webhook-id``), first arrivals in order; redeliveries are allowed (at
  least once) and reported separately;
- each actor instance counted its key's events once, in order
  (redeliveries reported separately);
- no errors: no failed request, no tail or reader cut off, no ERROR line or
  traceback in the server's log, no dead letter, no halted subscription, the
  server alive throughout;
- after the first ``--warmup-minutes`` (5), RSS grows less than
  ``--rss-growth-pct`` (5) % from the first sample to the last (first, last
  and max reported). A run too short to have two samples after the warm-up
  leaves RSS unjudged (said so; not a failure).

It prints a verdict per backend and exits 1 if any check failed. The last
line is one JSON object with every figure. PostgreSQL runs in a scratch
database created through ``YOKE_BENCH_PG_URL`` (default
postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the end; the
SQLite file, data dir and server log live in a temporary directory
(``--keep`` keeps it and prints where). The defaults put about 150 events/s
on the stream (about 7,500 tail deliveries/s) and keep the 2-core machine
below saturation.

    .venv/bin/python bench/soak.py [--backend sqlite|postgres|both] [--minutes 30]
        [--warmup-minutes 5] [--single-rate 40] [--batch-rate 1] [--batch-size 100]
        [--actor-rate 10] [--tails 50] [--ds-readers 6] [--sample-s 10] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import orjson

from http_api import DEFAULT_PG_URL, backend_database, free_port  # bench/http_api.py
from yoke.subscriptions.webhooks import verify

BENCH_DIR = Path(__file__).resolve().parent
MAIN = "soak-main"  # Yoke path /soak-main; Durable Streams name soak-main
COPY = "soak-copy"
IDLE_RECONNECT_S = 4.0  # the server closes kept-alive connections idle for 5 s (http_keep_alive_s)
CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_EXAMPLES = 5  # error messages kept per kind


# --- errors and checks ----------------------------------------------------------------


class Errors:
    """Every unexpected thing the clients saw, by kind, with a few examples."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, kind: str, message: str) -> None:
        self.counts[kind] += 1
        examples = self.examples.setdefault(kind, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(f"{time.strftime('%H:%M:%S')} {message[:300]}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not judged
    detail: str


# --- a minimal HTTP/1.1 client ------------------------------------------------------------


class Closed(Exception):
    """The connection ended before a whole answer arrived."""


class Http:
    """A keep-alive HTTP/1.1 connection on asyncio streams (as bench/http_api.py:
    a client library would cost more CPU than the server on the same 2 cores).
    Reconnects by itself when idle longer than the server keeps connections."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def _connect(self) -> None:
        await self.close()
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 22)

    async def send(self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        if self.writer is None or time.monotonic() - self.used > IDLE_RECONNECT_S or self.writer.is_closing():
            await self._connect()
        assert self.writer is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}"
        ).encode()
        self.writer.write(head + self.auth + b"\r\n" + body)
        self.used = time.monotonic()

    async def head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        line = await self.reader.readline()
        if not line:
            raise Closed("connection closed before the status line")
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def chunks(self) -> Any:
        """A chunked body, chunk by chunk (SSE)."""
        assert self.reader is not None
        while True:
            line = await self.reader.readline()
            if not line:
                raise Closed("connection closed inside a chunked body")
            size = int(line.strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return
            self.used = time.monotonic()
            yield data[:-2]

    async def body(self, status: int, headers: dict[str, str]) -> bytes:
        assert self.reader is not None
        if status in (204, 304):
            return b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return b"".join([chunk async for chunk in self.chunks()])
        length = int(headers.get("content-length", "0"))
        return await self.reader.readexactly(length) if length else b""

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One request and its whole answer. A GET on a kept-alive connection
        that the server closed meanwhile is sent again once, on a new one."""
        for attempt in (1, 2):
            try:
                await self.send(method, target, body, headers)
                status, answer_headers = await self.head()
                data = await self.body(status, answer_headers)
            except (Closed, ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if method != "GET" or attempt == 2:
                    raise
                continue
            self.used = time.monotonic()
            if answer_headers.get("connection", "").lower() == "close":
                await self.close()
            return status, answer_headers, data
        raise AssertionError("unreachable")


def sse_blocks(buffer: bytearray, chunk: bytes) -> list[dict[str, Any]]:
    """Append ``chunk``; return the complete SSE events in the buffer as
    ``{"event", "id", "data"}`` (comments as ``{"comment": text}``)."""
    buffer += chunk
    out: list[dict[str, Any]] = []
    while (end := buffer.find(b"\n\n")) >= 0:
        block = bytes(buffer[:end])
        del buffer[: end + 2]
        frame: dict[str, Any] = {"event": "message", "id": None, "data": []}
        comment = None
        for line in block.split(b"\n"):
            if line.startswith(b":"):
                comment = line[1:].strip()
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                frame["data"].append(value)
            elif name == b"id":
                frame["id"] = value
            elif name == b"event":
                frame["event"] = value.decode()
        if frame["data"] or frame["id"] is not None or frame["event"] != "message":
            frame["data"] = b"\n".join(frame["data"])
            out.append(frame)
        elif comment is not None:
            out.append({"comment": comment})
    return out


# --- the consumers ------------------------------------------------------------------------------


class Sequence:
    """What one consumer received, checked as it arrives: the next position
    expected, a digest of everything in order, gaps and duplicates."""

    def __init__(self) -> None:
        self.last = 0  # the highest offset received
        self.received = 0
        self.gaps = 0  # offsets skipped
        self.dups = 0  # offsets received again (at or below the last)
        self.digest = hashlib.blake2b(digest_size=16)


class Tail:
    """One SSE tail of /soak-main from its first event; reconnects with
    Last-Event-ID every 0.5-1.5 x churn seconds (never with churn 0)."""

    def __init__(self, soak: Soak, index: int) -> None:
        self.soak = soak
        self.index = index
        self.seq = Sequence()
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def run(self) -> None:
        soak = self.soak
        while not soak.finished.is_set():
            http = Http(soak.port, soak.token)
            churn = soak.args.tail_churn_s
            until = time.monotonic() + random.uniform(0.5, 1.5) * churn if churn > 0 else float("inf")
            try:
                await http.send("GET", f"/v1/streams/{MAIN}/-/tail", headers={"Last-Event-ID": str(self.seq.last)})
                status, _ = await http.head()
                if status != 200:
                    soak.errors.add("tail", f"tail {self.index} answered {status}")
                    await asyncio.sleep(1)
                    continue
                buffer = bytearray()
                async for chunk in http.chunks():
                    for frame in sse_blocks(buffer, chunk):
                        if "comment" in frame:
                            self.connected.set()
                            continue
                        if frame["event"] != "message":
                            soak.errors.add("tail", f"tail {self.index}: event {frame['event']}: {frame['data'][:200]!r}")
                            continue
                        self.take(int(frame["id"]), orjson.loads(frame["data"]))
                    if time.monotonic() >= until or soak.finished.is_set():
                        break
                else:
                    soak.errors.add("tail", f"tail {self.index} ended by the server at offset {self.seq.last}")
            except (Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                soak.errors.add("tail", f"tail {self.index} cut off at offset {self.seq.last}: {exc!r}")
                await asyncio.sleep(1)
            finally:
                await http.close()
            self.reconnects += not soak.finished.is_set()

    def take(self, offset: int, event: dict[str, Any]) -> None:
        seq = self.seq
        seq.received += 1
        if offset <= seq.last:
            seq.dups += 1
            return
        seq.gaps += offset - seq.last - 1
        seq.last = offset
        seq.digest.update(b"%d:%s\n" % (offset, event["id"].encode()))


def ds_token(offset: int) -> str:
    return f"{offset:016d}_0000000000000000"


def ds_offset(token: str) -> int:
    return int(token.split("_", 1)[0])


def canonical(message: Any) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


class DsReader:
    """A Durable Streams reader of soak-main from the beginning: ``catchup``
    (polls without live), ``long-poll`` or ``sse``. Each answer's messages
    must fill exactly the span from the reader's offset to the answer's
    Stream-Next-Offset; a digest of the messages is compared at the end."""

    def __init__(self, soak: Soak, index: int, mode: str) -> None:
        self.soak = soak
        self.index = index
        self.mode = mode
        self.seq = Sequence()
        self.requests = 0

    def take(self, messages: list[Any], next_offset: int) -> None:
        seq = self.seq
        span = next_offset - seq.last
        seq.received += len(messages)
        if span < len(messages):
            seq.dups += len(messages) - max(span, 0)
        elif span > len(messages):
            seq.gaps += span - len(messages)
        for message in messages:
            seq.digest.update(canonical(message) + b"\n")
        seq.last = max(seq.last, next_offset)

    async def run(self) -> None:
        soak = self.soak
        http = Http(soak.port, soak.token)
        cursor: str | None = None
        try:
            while not soak.finished.is_set():
                try:
                    if self.mode == "sse":
                        await self.sse(http)
                        continue
                    target = f"/v1/stream/{MAIN}?offset={ds_token(self.seq.last) if self.seq.last else '-1'}"
                    if self.mode == "long-poll":
                        target += "&live=long-poll" + (f"&cursor={quote(cursor)}" if cursor else "")
                    status, headers, body = await http.request("GET", target)
                    self.requests += 1
                    if status not in (200, 204):
                        soak.errors.add("ds", f"DS {self.mode} reader {self.index}: {status} {body[:200]!r}")
                        await asyncio.sleep(1)
                        continue
                    cursor = headers.get("stream-cursor", cursor)
                    next_offset = ds_offset(headers["stream-next-offset"])
                    messages = orjson.loads(body) if status == 200 else []
                    self.take(messages, next_offset)
                    if self.mode == "catchup" and headers.get("stream-up-to-date") == "true":
                        await soak.sleep(soak.args.ds_poll_s)
                except (Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                    soak.errors.add("ds", f"DS {self.mode} reader {self.index} cut off: {exc!r}")
                    await http.close()
                    await asyncio.sleep(1)
        finally:
            await http.close()

    async def sse(self, http: Http) -> None:
        """One SSE response: ``data`` events, each followed by a ``control``
        event with the next offset; the server ends it after 60 s."""
        soak = self.soak
        start = ds_token(self.seq.last) if self.seq.last else "-1"
        await http.send("GET", f"/v1/stream/{MAIN}?offset={start}&live=sse")
        status, _ = await http.head()
        self.requests += 1
        if status != 200:
            soak.errors.add("ds", f"DS sse reader {self.index}: {status}")
            await http.close()
            await asyncio.sleep(1)
            return
        buffer = bytearray()
        pending: list[Any] = []
        try:
            async for chunk in http.chunks():
                for frame in sse_blocks(buffer, chunk):
                    if "comment" in frame:
                        continue
                    if frame["event"] == "data":
                        pending.extend(orjson.loads(frame["data"]))
                    elif frame["event"] == "control":
                        control = orjson.loads(frame["data"])
                        self.take(pending, ds_offset(control["streamNextOffset"]))
                        pending = []
                    else:
                        soak.errors.add("ds", f"DS sse reader {self.index}: event {frame['event']}")
                if soak.finished.is_set():
                    break
        finally:
            await http.close()
        if pending:
            soak.errors.add("ds", f"DS sse reader {self.index}: a data event without its control event")


class Receiver:
    """The webhook receiver, on 127.0.0.1 in this process: answers 204,
    verifies each signature, and keeps per offset how often it arrived and
    a digest of the first arrivals in their order."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.secret = ""
        self.counts = bytearray()  # by offset (saturating at 255)
        self.posts = 0
        self.connections = 0  # TCP connections the server opened to deliver them
        self.last_first = 0  # the highest offset received
        self.out_of_order = 0  # first arrivals below an earlier one
        self.digest = hashlib.blake2b(digest_size=16)
        self.server: asyncio.Server | None = None
        self.port = 0
        self.open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}  # the connections' handlers

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the kept-alive connections too: each handler then reads the
        end of its stream and returns (a handler still waiting when the
        loop ends would be cancelled, and asyncio prints that)."""
        if self.server is not None:
            self.server.close()
        for writer in self.open.values():
            writer.close()
        if self.open:
            await asyncio.wait(list(self.open), timeout=2)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.open[task] = writer
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = h.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.take(headers, body)
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            del self.open[task]
            writer.close()

    def take(self, headers: dict[str, str], body: bytes) -> None:
        self.posts += 1
        try:
            verify(self.secret, headers, body)
        except (KeyError, ValueError) as exc:
            self.soak.errors.add("webhook", f"a webhook failed verification: {exc!r}")
            return
        offset = int(headers["webhook-id"].rsplit(":", 1)[1])
        if offset >= len(self.counts):
            self.counts.extend(bytes(offset + 1024 - len(self.counts)))
        seen = self.counts[offset]
        self.counts[offset] = min(seen + 1, 255)
        if seen:
            return
        if offset < self.last_first:
            self.out_of_order += 1
        self.last_first = max(self.last_first, offset)
        event_id = orjson.loads(body)["event"]["id"]
        self.digest.update(b"%d:%s\n" % (offset, event_id.encode()))


def content_digest(event: dict[str, Any]) -> bytes:
    return hashlib.blake2b(canonical([event["type"], event["payload"]]), digest_size=8).digest()


class Reference:
    """/soak-main as read back over HTTP at the end, taken event by event
    (the whole stream is never held): the digests each kind of consumer
    must match, each producer's (n, offset) pairs, the soak events' offsets
    and content, and each actor key's sequence numbers."""

    def __init__(self) -> None:
        self.count = 0
        self.head = 0
        self.gapless = True
        self.ids = hashlib.blake2b(digest_size=16)  # what a tail received
        self.messages = hashlib.blake2b(digest_size=16)  # what a DS reader received
        self.hook = hashlib.blake2b(digest_size=16)  # what the webhook receiver got first
        self.by_producer: dict[str, list[tuple[int, int]]] = {}
        self.soak_offsets = array("q")  # the offsets of the soak.* events (copied, webhooked)
        self.content: dict[int, bytes] = {}  # their type and payload, digested
        self.work: dict[str, list[int]] = {}  # an actor key's sequence numbers, in stream order

    def take(self, e: dict[str, Any]) -> None:
        offset, payload = e["offset"], e["payload"]
        self.count += 1
        self.gapless &= offset == self.head + 1
        self.head = offset
        line = b"%d:%s\n" % (offset, e["id"].encode())
        self.ids.update(line)
        self.messages.update(canonical({"type": e["type"], "payload": payload}) + b"\n")
        if not e["type"].startswith("soak."):
            return
        self.hook.update(line)
        self.soak_offsets.append(offset)
        self.content[offset] = content_digest(e)
        self.by_producer.setdefault(payload["p"], []).append((payload["n"], offset))
        if e["type"] == "soak.work":
            self.work.setdefault(payload["k"], []).append(payload["s"])


# --- the producers ---------------------------------------------------------------------------


class Producer:
    """Appends one after another (so its events keep its order), paced to
    ``rate`` calls per second; keeps the offset of each acknowledged event."""

    def __init__(self, soak: Soak, name: str, rate: float, batch: int = 1, work: bool = False) -> None:
        self.soak = soak
        self.name = name
        self.rate = rate
        self.batch = batch
        self.work = work  # soak.work events for the actor
        self.n = 0
        self.acked: list[tuple[int, int]] = []  # (n, offset)
        self.sent_by_key: Counter[str] = Counter()

    def event(self) -> dict[str, Any]:
        self.n += 1
        payload: dict[str, Any] = {"p": self.name, "n": self.n, "pad": "x" * 64}
        if self.work:
            key = f"k{self.n % self.soak.args.actor_keys}"
            self.sent_by_key[key] += 1
            payload.update(k=key, s=self.sent_by_key[key])
            return {"type": "soak.work", "payload": payload}
        return {"type": "soak.event" if self.batch == 1 else "soak.batch", "payload": payload}

    async def run(self) -> None:
        soak = self.soak
        loop = asyncio.get_running_loop()
        http = Http(soak.port, soak.token)
        interval = 1.0 / self.rate
        due = loop.time() + random.uniform(0, interval)
        try:
            while not soak.stop_load.is_set():
                await asyncio.sleep(max(0.0, due - loop.time()))
                due += interval
                if loop.time() - due > 1.0:  # fell behind: no burst to catch up
                    due = loop.time()
                events = [self.event() for _ in range(self.batch)]
                body = orjson.dumps(events[0] if self.batch == 1 else events)
                try:
                    status, _, answer = await http.request("POST", f"/v1/streams/{MAIN}/-/events", body)
                except (Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                    soak.errors.add("append", f"{self.name}: {exc!r}")
                    continue
                if status != 201:
                    soak.errors.add("append", f"{self.name}: {status} {answer[:200]!r}")
                    continue
                result = orjson.loads(answer)
                offsets = [result["offset"]] if self.batch == 1 else [r["offset"] for r in result["results"]]
                for event, offset in zip(events, offsets, strict=True):
                    self.acked.append((event["payload"]["n"], offset))
                soak.head = max(soak.head, offsets[-1])
                soak.appended += len(offsets)
        finally:
            await http.close()


# --- the server -----------------------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    token: str
    log: Path
    log_pos: int = 0
    log_errors: list[str] = field(default_factory=list)
    log_warnings: list[str] = field(default_factory=list)

    def scan_log(self) -> None:
        """New lines of the server's log: ERROR/CRITICAL lines and tracebacks
        are errors, WARNING lines are reported."""
        with self.log.open("rb") as f:
            f.seek(self.log_pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.log_pos += end
        for line in data[:end].decode(errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                self.log_errors.append(line)
            elif " WARNING " in line:
                self.log_warnings.append(line)


def start_server(db_url: str, workdir: Path) -> Server:
    port = free_port()
    data_dir = workdir / ".yoke"
    log_path = workdir / "server.log"
    env = {
        **os.environ,
        "YOKE_DATABASE_URL": db_url,
        "YOKE_DATA_DIR": str(data_dir),
        "YOKE_PORT": str(port),
        "YOKE_ACCESS_LOG": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
    }
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "yoke.cli", "serve", "--app", "soak_app:app"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1) as probe:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"yoke serve exited ({process.returncode}):\n{log_path.read_text()[-4000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if probe.get("/readyz").status_code == 200 and (data_dir / f"token-{port}").exists():
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("yoke serve did not become ready within 60 s")
                time.sleep(0.1)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return Server(process, port, (data_dir / f"token-{port}").read_text().strip(), log_path)


def stop_server(server: Server) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


# --- sampling ---------------------------------------------------------------------------------------


def proc_figures(pid: int) -> tuple[int, int, float]:
    """RSS (bytes), open files, CPU seconds (user + system) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
                break
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return rss, fds, cpu


COLUMNS = [  # (title, width, format)
    ("t", 6, ""), ("rss MiB", 8, ".1f"), ("fds", 5, ""), ("db conns", 8, ""), ("cpu %", 6, ".0f"),
    ("appended", 9, ""), ("ev/s", 6, ".0f"), ("queue", 6, ""), ("fanout", 6, ""), ("sub lag", 7, ""),
    ("tails", 6, ""), ("ds", 6, ""), ("hook", 6, ""), ("errors", 6, ""), ("load", 5, ".2f"),
]


def header() -> str:
    return "  ".join(name.rjust(width) for name, width, _ in COLUMNS)


def row(sample: dict[str, Any]) -> str:
    """One sample as a table row: time since the load started, the server's
    RSS, open files, database connections (active), CPU; events appended and
    their rate; the actor queue, fan-out lag and subscriptions' lag; how many
    events the slowest tail, DS reader and the webhook receiver are behind
    the highest acknowledged offset; errors so far; the load average."""
    values = [
        f"{int(sample['t']) // 60}:{int(sample['t']) % 60:02d}", sample["rss"] / 2**20, sample["fds"],
        sample["db_conns_text"], sample["cpu_pct"], sample["appended"], sample["rate"], sample["queue"],
        sample["fanout_lag"], sample["sub_lag"], sample["tails_behind"], sample["ds_behind"],
        sample["hook_behind"], sample["errors"], sample["load"],
    ]
    return "  ".join(
        ("-" if v is None else format(v, fmt)).rjust(width)
        for (_, width, fmt), v in zip(COLUMNS, values, strict=True)
    )


# --- one soak -------------------------------------------------------------------------------------


class Soak:
    def __init__(self, backend: str, args: argparse.Namespace, server: Server, db_name: str | None) -> None:
        self.backend = backend
        self.args = args
        self.server = server
        self.port = server.port
        self.token = server.token
        self.db_name = db_name
        self.errors = Errors()
        self.stop_load = asyncio.Event()
        self.finished = asyncio.Event()  # the consumers stop
        self.head = 0  # the highest acknowledged offset
        self.appended = 0
        self.samples: list[dict[str, Any]] = []
        self.tails = [Tail(self, i) for i in range(args.tails)]
        modes = ["catchup", "long-poll", "sse"]
        self.readers = [DsReader(self, i, modes[i % 3]) for i in range(args.ds_readers)]
        self.receiver = Receiver(self)
        per = args.single_rate / args.producers
        self.producers = [Producer(self, f"s{i}", per) for i in range(args.producers) if per > 0]
        if args.batch_rate > 0:
            self.producers.append(Producer(self, "b0", args.batch_rate, batch=args.batch_size))
        self.feeder = Producer(self, "a0", args.actor_rate, work=True) if args.actor_rate > 0 else None
        if self.feeder is not None:
            self.producers.append(self.feeder)
        self.http = Http(self.port, self.token)

    async def sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), seconds)

    async def call(self, method: str, target: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        data = b"" if body is None else orjson.dumps(body)
        status, _, answer = await self.http.request(method, target, data)
        if status not in ok:
            raise RuntimeError(f"{method} {target} answered {status}: {answer[:500]!r}")
        return orjson.loads(answer) if answer else None

    async def setup(self) -> None:
        await self.receiver.start()
        await self.call("PUT", f"/v1/streams/{MAIN}", {})
        await self.call("POST", f"/v1/streams/{MAIN}/-/subscriptions", {
            "name": "copy", "receiver": {"kind": "copy", "target": f"/{COPY}"},
            "filter": {"types": ["soak.*"]}, "start": "beginning",
        })  # fmt: skip
        answer = await self.call("POST", f"/v1/streams/{MAIN}/-/subscriptions", {
            "name": "hook", "receiver": {"kind": "webhook", "url": f"http://127.0.0.1:{self.receiver.port}/hook"},
            "filter": {"types": ["soak.*"]}, "start": "beginning",
        })  # fmt: skip
        self.receiver.secret = answer["secret"]

    async def run(self) -> dict[str, Any]:
        args = self.args
        await self.setup()
        consumers = [asyncio.create_task(t.run()) for t in self.tails]
        consumers += [asyncio.create_task(r.run()) for r in self.readers]
        async with asyncio.timeout(60):
            await asyncio.gather(*(t.connected.wait() for t in self.tails))
        self.started = time.monotonic()
        print(header(), flush=True)
        sampler = asyncio.create_task(self.sampler())
        load = [asyncio.create_task(p.run()) for p in self.producers]
        await asyncio.sleep(args.minutes * 60)
        self.stop_load.set()
        await asyncio.gather(*load, return_exceptions=True)
        for task in load:
            if not task.cancelled() and task.exception() is not None:
                self.errors.add("client", f"a producer failed: {task.exception()!r}")
        self.load_s = time.monotonic() - self.started
        await sampler
        await self.sample()  # the last sample of the load
        self.drained, self.drain_s, self.drain_note = await self.drain()
        self.finished.set()
        await asyncio.sleep(0.5)
        for task in consumers:
            task.cancel()
        for result in await asyncio.gather(*consumers, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                self.errors.add("client", f"a consumer failed: {result!r}")
        verdict = await self.verify()
        await self.http.close()
        await self.receiver.stop()
        return verdict

    # -- sampling

    async def sampler(self) -> None:
        """A sample every --sample-s until the load stops (never cancelled
        in the middle of a request)."""
        due = time.monotonic()
        while True:
            due += self.args.sample_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_load.wait(), max(0.0, due - time.monotonic()))
            if self.stop_load.is_set():
                return
            await self.sample()

    async def sample(self) -> None:
        now = time.monotonic()
        try:
            rss, fds, cpu = proc_figures(self.server.process.pid)
        except FileNotFoundError:
            self.errors.add("server", "the server process is gone")
            rss, fds, cpu = 0, 0, 0.0
        previous = self.samples[-1] if self.samples else None
        dt = now - (previous["mono"] if previous else self.started)
        conns_text, conns = "-", None
        if self.db_name is not None:
            conn = await asyncpg.connect(os.environ.get("YOKE_BENCH_PG_URL", DEFAULT_PG_URL))
            try:
                row_ = await conn.fetchrow(
                    "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'active') AS active"
                    " FROM pg_stat_activity WHERE datname = $1", self.db_name,
                )  # fmt: skip
            finally:
                await conn.close()
            conns = {"total": row_["n"], "active": row_["active"]}
            conns_text = f"{row_['n']} ({row_['active']})"
        try:
            overview = await self.call("GET", "/v1/overview")
        except (RuntimeError, Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
            self.errors.add("client", f"overview: {exc!r}")
            overview = None
        self.server.scan_log()
        head = self.head
        sample = {
            "mono": now,
            "t": now - self.started,
            "rss": rss,
            "fds": fds,
            "cpu_s": cpu,
            "cpu_pct": 100 * (cpu - (previous["cpu_s"] if previous else self.cpu_at_start)) / max(dt, 1e-9),
            "db_conns": conns,
            "db_conns_text": conns_text,
            "appended": self.appended,
            "rate": (self.appended - (previous["appended"] if previous else 0)) / max(dt, 1e-9),
            "queue": None, "fanout_lag": None, "sub_lag": None, "halted": None, "dead": None, "open_tails": None,
            "tails_behind": head - min((t.seq.last for t in self.tails), default=head),
            "ds_behind": head - min((r.seq.last for r in self.readers), default=head),
            "hook_behind": head - self.receiver.last_first,
            "errors": self.errors.total + len(self.server.log_errors),
            "load": os.getloadavg()[0],
        }
        if overview is not None:
            sample.update(
                queue=overview["queue"]["pending"] + overview["queue"]["processing"],
                dead=overview["queue"]["dead"],
                fanout_lag=overview["fanout"]["lag"],
                sub_lag=overview["subscriptions"]["lag"],
                halted=overview["subscriptions"]["halted"],
                open_tails=overview["open_tails"],
            )
        self.samples.append(sample)
        print(row(sample), flush=True)

    # -- the end

    async def drain(self) -> tuple[bool, float, str]:
        """Until every consumer has reached the head (or --drain-s)."""
        start = time.monotonic()
        info = await self.call("GET", f"/v1/streams/{MAIN}")
        head = info["head"]
        deadline = start + self.args.drain_s
        waiting = "?"
        while time.monotonic() < deadline:
            waiting = await self.behind(head)
            if not waiting:
                return True, time.monotonic() - start, ""
            await asyncio.sleep(1)
        return False, time.monotonic() - start, f"not caught up after {self.args.drain_s:g} s: {waiting}"

    async def behind(self, head: int) -> str:
        late = []
        tails = sum(t.seq.last < head for t in self.tails)
        if tails:
            late.append(f"{tails} tails")
        readers = sum(r.seq.last < head for r in self.readers)
        if readers:
            late.append(f"{readers} DS readers")
        for name in ("copy", "hook"):
            status = await self.call("GET", f"/v1/streams/{MAIN}/-/subscription?name={name}")
            through = status.get("processed_through_offset", 0)
            if through < head:
                late.append(f"subscription {name} at {through}/{head}")
        overview = await self.call("GET", "/v1/overview")
        queue = overview["queue"]["pending"] + overview["queue"]["processing"]
        if queue or overview["fanout"]["lag"]:
            late.append(f"actor queue {queue}, fan-out lag {overview['fanout']['lag']}")
        return ", ".join(late)

    async def pages(self, path: str) -> Any:
        """The stream's events over HTTP, a page at a time, from the first."""
        after = 0
        while True:
            page = await self.call("GET", f"/v1/streams/{path}/-/events?after={after}&limit=10000")
            if not page["events"]:
                return
            yield page["events"]
            after = page["next_after"]

    async def verify(self) -> dict[str, Any]:
        checks: list[Check] = []
        notes: list[str] = []
        ref = Reference()
        async for page in self.pages(MAIN):
            for e in page:
                ref.take(e)
        head = ref.head
        checks.append(Check("stream offsets 1..head, gapless", ref.gapless, f"{ref.count} events, head {head}"))

        # Producers: every acknowledged append there once, at its offset, in order.
        lost = extra = 0
        for producer in self.producers:
            stored = ref.by_producer.get(producer.name, [])
            acked, kept = set(producer.acked), set(stored)
            lost += len(acked - kept)
            extra += len(stored) - len(acked & kept)
            extra += sum(a[0] >= b[0] for a, b in zip(stored, stored[1:]))  # out of the producer's order
        acked_total = sum(len(p.acked) for p in self.producers)
        checks.append(Check(
            "acknowledged appends stored once, at their offsets, in order", lost == 0 and extra == 0,
            f"{acked_total} acknowledged; {lost} missing, {extra} unacknowledged or misplaced",
        ))  # fmt: skip

        # Tails and DS readers: the whole stream, in order.
        for kind, consumers, reference in (
            ("SSE tails", self.tails, ref.ids), ("DS readers", self.readers, ref.messages)
        ):
            gaps = sum(c.seq.gaps + max(head - c.seq.last, 0) for c in consumers)
            dups = sum(c.seq.dups for c in consumers)
            wrong = sum(c.seq.digest.digest() != reference.digest() for c in consumers)
            received = sum(c.seq.received for c in consumers)
            checks.append(Check(
                f"{kind} ({len(consumers)}): every event once, in order", gaps == 0 and dups == 0 and wrong == 0,
                f"{received} received; {gaps} missing, {dups} duplicated, {wrong} of {len(consumers)} differ from the stream",
            ))  # fmt: skip
        notes.append(f"tail reconnects: {sum(t.reconnects for t in self.tails)}; DS requests: "
                     + ", ".join(f"{r.mode} {r.requests}" for r in self.readers))

        # The copy target: the soak events once each, in their order, same type and payload.
        expected = ref.soak_offsets
        copies = duplicated = misplaced = differ = 0
        seen: set[int] = set()
        async for page in self.pages(COPY):
            for c in page:
                copies += 1
                origin = c["source"]["copied_from"][-1]["offset"]
                if ref.content.get(origin) != content_digest(c):
                    differ += 1
                if origin in seen:
                    duplicated += 1
                    continue
                if len(seen) >= len(expected) or expected[len(seen)] != origin:
                    misplaced += 1
                seen.add(origin)
        missing = len(set(expected) - seen)
        checks.append(Check(
            "copy target: every soak event once, in order",
            missing == 0 and duplicated == 0 and misplaced == 0 and differ == 0,
            f"{copies} copies of {len(expected)}; {missing} missing, {duplicated} duplicated,"
            f" {misplaced} out of order or unexpected, {differ} differ",
        ))  # fmt: skip

        # The webhook receiver (at least once: duplicates reported, not failed).
        r = self.receiver
        got = {o for o in range(len(r.counts)) if r.counts[o]}
        hook_missing = len(set(expected) - got)
        hook_unexpected = len(got - set(expected))
        hook_dups = sum(max(c - 1, 0) for c in r.counts)
        checks.append(Check(
            "webhook receiver: every soak event, first arrivals in order",
            hook_missing == 0 and hook_unexpected == 0 and r.out_of_order == 0 and r.digest.digest() == ref.hook.digest(),
            f"{r.posts} POSTs on {r.connections} connections for {len(expected)} events; {hook_missing} missing,"
            f" {hook_unexpected} unexpected,"
            f" {r.out_of_order} out of order; redeliveries (allowed): {hook_dups}",
        ))  # fmt: skip

        redeliveries = {"webhook": hook_dups, "actor": None}

        # The actor: per key, the soak.work events the stream holds (s = 1, 2, ...
        # unless an append failed, which is an error already), counted once, in order.
        if self.feeder is not None:
            listing = await self.call("GET", "/v1/instances?actor=soak&limit=100")
            states = {}
            for instance in listing["instances"]:
                shown = await self.call("GET", f"/v1/instances/{instance['id']}")
                states[instance["key"]] = (shown.get("state") or {}).get("value") or {}
            stored = ref.work
            wrong_keys = [
                k for k in sorted(set(stored) | set(states))
                if (states.get(k, {}).get("count"), states.get(k, {}).get("last"))
                != (len(stored.get(k, [])), max(stored.get(k, [0])))
                or states.get(k, {}).get("jumps", 0)
            ]  # fmt: skip
            actor_dups = sum(s.get("dups", 0) for s in states.values())
            redeliveries["actor"] = actor_dups
            counted = sum(s.get("count", 0) for s in states.values())
            checks.append(Check(
                f"actor: each key's events counted once, in order ({len(stored)} keys)", not wrong_keys,
                f"{counted} counted of {sum(len(v) for v in stored.values())} stored;"
                f" keys wrong: {wrong_keys or 'none'}; redeliveries (allowed): {actor_dups}",
            ))  # fmt: skip

        checks.append(Check("every consumer caught up", self.drained,
                            f"in {self.drain_s:.1f} s" if self.drained else self.drain_note))

        # Errors.
        alive = self.server.process.poll() is None
        self.server.scan_log()
        last = self.samples[-1]
        troubles = []
        if last.get("dead"):
            troubles.append(f"{last['dead']} dead letters")
        if last.get("halted"):
            troubles.append(f"{last['halted']} halted subscriptions")
        for name in ("copy", "hook"):
            status = await self.call("GET", f"/v1/streams/{MAIN}/-/subscription?name={name}")
            if status.get("failures") or status.get("state") != "running":
                troubles.append(f"subscription {name}: {status.get('failures')} failed deliveries,"
                                f" state {status.get('state')}, last error {status.get('last_error')!r}")
        error_total = self.errors.total + len(self.server.log_errors) + len(troubles) + (not alive)
        detail = ", ".join([f"{k}: {n}" for k, n in self.errors.counts.items()]
                           + ([f"server log: {len(self.server.log_errors)} ERROR lines"] if self.server.log_errors else [])
                           + troubles + ([] if alive else ["the server died"])) or "none"
        checks.append(Check("no errors", error_total == 0, detail))
        if self.server.log_warnings:
            notes.append(f"server log: {len(self.server.log_warnings)} WARNING lines, e.g. "
                         + " | ".join(self.server.log_warnings[:3]))

        checks.append(self.rss_check())
        return {"checks": checks, "notes": notes, "events": ref.count, "head": head, "redeliveries": redeliveries}

    def rss_check(self) -> Check:
        warm = self.args.warmup_minutes * 60
        after = [s for s in self.samples if s["t"] >= warm]
        name = f"RSS after the first {self.args.warmup_minutes:g} min grows < {self.args.rss_growth_pct:g}%"
        if len(after) < 2:
            return Check(name, None, f"not judged: {len(after)} sample(s) after the warm-up (a longer --minutes)")
        first, last, peak = after[0]["rss"], after[-1]["rss"], max(s["rss"] for s in after)
        growth = 100 * (last - first) / first
        self.rss = {"first": first, "last": last, "max": peak, "growth_pct": growth}
        return Check(name, growth < self.args.rss_growth_pct,
                     f"first {first / 2**20:.1f} MiB, last {last / 2**20:.1f} MiB, max {peak / 2**20:.1f} MiB,"
                     f" growth {growth:+.2f}%")


# --- per backend and main --------------------------------------------------------------------------


def summary(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [s[key] for s in samples if s.get(key) is not None]
    if not values:
        return {}
    return {"first": values[0], "last": values[-1], "max": max(values)}


def run_backend(backend: str, args: argparse.Namespace) -> tuple[bool, dict[str, Any]]:
    tmp = tempfile.mkdtemp(prefix=f"yoke-soak-{backend}-")
    workdir = Path(tmp)
    try:
        with backend_database(backend, workdir) as db_url:
            db_name = db_url.rsplit("/", 1)[1] if backend == "postgres" else None
            server = start_server(db_url, workdir)
            print(f"\n{backend}: yoke serve pid {server.process.pid} on port {server.port}, {args.minutes:g} min of load"
                  f" (workdir {workdir})", flush=True)
            try:
                result, soak = asyncio.run(soak_once(backend, args, server, db_name))
            except BaseException:
                print(f"--- {backend} server log (tail) ---\n{server.log.read_text()[-3000:]}", file=sys.stderr)
                raise
            finally:
                code = stop_server(server)
            server.scan_log()
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    checks: list[Check] = result["checks"]
    if code not in (0, -signal.SIGTERM):
        checks.append(Check("server stopped cleanly on SIGTERM", False, f"exit code {code}"))
    print(f"\n{backend}: verdict after {soak.load_s / 60:.1f} min of load, {result['events']:,} events on {MAIN}")
    for c in checks:
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[c.ok]
        print(f"  {mark}  {c.name}: {c.detail}")
    for note in result["notes"]:
        print(f"        note: {note}")
    for kind, examples in soak.errors.examples.items():
        for example in examples:
            print(f"        {kind} error: {example}")
    for line in server.log_errors[:10]:
        print(f"        server log: {line[:300]}")
    ok = all(c.ok is not False for c in checks)
    samples = soak.samples
    figures = {
        "passed": ok,
        "minutes": soak.load_s / 60,
        "events": result["events"],
        "appended": soak.appended,
        "tail_deliveries": sum(t.seq.received for t in soak.tails),
        "ds_messages": sum(r.seq.received for r in soak.readers),
        "rss": summary(samples, "rss"),
        "rss_after_warmup": getattr(soak, "rss", None),
        "fds": summary(samples, "fds"),
        "db_conns": summary([{"n": s["db_conns"]["total"]} for s in samples if s["db_conns"]], "n"),
        "cpu_pct_mean": sum(s["cpu_pct"] for s in samples) / max(len(samples), 1),
        "max": {k: max((s[k] for s in samples if s[k] is not None), default=None)
                for k in ("queue", "fanout_lag", "sub_lag", "tails_behind", "ds_behind", "hook_behind")},
        "redeliveries": result["redeliveries"],
        "webhook_posts": soak.receiver.posts,
        "webhook_connections": soak.receiver.connections,
        "drain_s": soak.drain_s,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        "samples": [{k: v for k, v in s.items() if k not in ("mono", "db_conns_text")} for s in samples],
    }
    print(figures_line(backend, figures))
    print(f"{backend}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok, figures


def figures_line(backend: str, f: dict[str, Any]) -> str:
    """The figures docs/production/faults.md reports, in one paragraph."""

    def three(d: dict[str, Any], scale: int = 1, fmt: str = "") -> str:
        values = (d[k] / scale if scale != 1 else d[k] for k in ("first", "last", "max"))
        return " / ".join(format(v, fmt) for v in values) if d else "-"

    warm = f["rss_after_warmup"]
    after = (f"after the warm-up {three(warm, 2**20, '.1f')} MiB, growth {warm['growth_pct']:+.2f}%"
             if warm else "not judged (too short)")
    m = f["max"]
    return (
        f"{backend}: figures: {f['appended']:,} events appended ({f['events']:,} on the stream),"
        f" {f['tail_deliveries']:,} tail deliveries, {f['ds_messages']:,} DS messages;"
        f" RSS first / last / max {three(f['rss'], 2**20, '.1f')} MiB, {after};"
        f" open files {three(f['fds'])}; database connections {three(f['db_conns'])};"
        f" server CPU mean {f['cpu_pct_mean']:.0f}%; max actor queue {m['queue']}, fan-out lag"
        f" {m['fanout_lag']}, subscription lag {m['sub_lag']}; max behind: tails {m['tails_behind']},"
        f" DS {m['ds_behind']}, webhook {m['hook_behind']}; {f['webhook_posts']:,} webhook POSTs on"
        f" {f['webhook_connections']:,} connections; redeliveries: webhook"
        f" {f['redeliveries']['webhook']}, actor {f['redeliveries']['actor']}; drained in {f['drain_s']:.1f} s"
    )


async def soak_once(
    backend: str, args: argparse.Namespace, server: Server, db_name: str | None
) -> tuple[dict[str, Any], Soak]:
    soak = Soak(backend, args, server, db_name)
    soak.cpu_at_start = proc_figures(server.process.pid)[2]
    return await soak.run(), soak


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of load per backend (default 30)")
    parser.add_argument("--warmup-minutes", type=float, default=5.0, help="RSS is judged after these (default 5)")
    parser.add_argument("--rss-growth-pct", type=float, default=5.0, help="allowed RSS growth after the warm-up")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (default 10)")
    parser.add_argument("--single-rate", type=float, default=40.0, help="single-event appends per second, in all")
    parser.add_argument("--producers", type=int, default=4, help="connections the single appends are spread over")
    parser.add_argument("--batch-rate", type=float, default=1.0, help="batches per second (0: none)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--actor-rate", type=float, default=10.0, help="soak.work events per second (0: none)")
    parser.add_argument("--actor-keys", type=int, default=4)
    parser.add_argument("--tails", type=int, default=50)
    parser.add_argument("--tail-churn-s", type=float, default=120.0,
                        help="a tail reconnects after 0.5-1.5 x this many seconds (0: never)")
    parser.add_argument("--ds-readers", type=int, default=6, help="Durable Streams readers: catch-up, long-poll, SSE in turn")
    parser.add_argument("--ds-poll-s", type=float, default=1.0, help="a catch-up reader's pause once up to date")
    parser.add_argument("--drain-s", type=float, default=180.0, help="how long the consumers may take to catch up")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server log, SQLite file)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupt)

    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    print(f"yoke soak: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; per backend {args.minutes:g} min:"
          f" {args.single_rate:g} single appends/s over {args.producers} connections, {args.batch_rate:g} batches/s of"
          f" {args.batch_size}, {args.actor_rate:g} actor events/s over {args.actor_keys} keys; {args.tails} SSE tails,"
          f" {args.ds_readers} DS readers, a copy and a webhook subscription; a sample every {args.sample_s:g} s",
          flush=True)
    results: dict[str, Any] = {"args": vars(args)}
    passed = True
    for backend in backends:
        ok, figures = run_backend(backend, args)
        passed &= ok
        results[backend] = figures
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results["client_cpu_s"] = usage.ru_utime + usage.ru_stime
    print(f"\n{'PASS' if passed else 'FAIL'} ({', '.join(backends)}); this script's own CPU: {results['client_cpu_s']:.0f} s")
    print(json.dumps(results, default=str))
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted (server stopped, scratch database dropped)", file=sys.stderr)
        sys.exit(130)
