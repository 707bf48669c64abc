"""The rule matrix (issue 30, "One enforcement point"): every rule a stream
carries × every surface × read / tail / head / append / fork / copy / delete,
on both backends, against a real ``yoke serve`` and, as the application, a
runtime opened in this process on the same database (``yoke.open``).

``TABLE`` is the whole matrix: one row per (rule, surface, caller) with the
answer expected of each operation. A new rule is a ``RULES`` entry and its
rows; a new surface is a ``SURFACES`` entry (its operations) and its rows.
Each cell is a test of its own (so a wrong cell can be marked xfail in
``XFAIL``); the cells of a rule share one fresh stream per backend, except
deletions, which each get a fresh stream of the rule.

Surfaces: ``v1`` (/v1/streams, the generic API), ``console`` (the same
routes with the console's session cookie), ``ds`` (/v1/stream, Durable
Streams), ``cli`` (``yoke``, a client of /v1), ``workflow``
(/api/workflow-streams) and ``python`` (the application: not restricted by
authorization, redaction or egress; bound by content classes, the input
outbox, legal hold, closed and retention).

Copies are cells of the data handling rules: a copy subscription with the
pinned stream as its source (``copy_from``) or its target (``copy_into``),
configured through /v1 (refused) or Python (allowed; a copy into a stream
that refuses its records fails at delivery: the subscription's last error).
The application has no fork of its own (forks are a protocol's): its
``copy_from`` stands for one.

The legal hold's protocol cases that are sequences, not cells (forks, a
chain of forks, TTL expiry, retention) follow the matrix.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import connect_sse

import yoke
from yoke import errors

from .conftest import Server

# --- the application: a runtime in this process, on a loop of its own ------------------


class App:
    """``yoke.open(db_url)`` on a thread's event loop; ``call`` runs a coroutine there."""

    def __init__(self, db_url: str, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="yoke-app", daemon=True)
        self.thread.start()
        self._opened = yoke.open(db_url, data_dir=str(data_dir))
        self.runtime = self.call(self._opened.__aenter__())

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.call(self._opened.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


# --- what an operation answered, whatever the surface ------------------------------------


@dataclass
class Got:
    status: int  # HTTP status; the CLI's and Python's errors: the error's status; success: 200
    code: str | None = None  # the error code (None: success, or an answer without a body: HEAD)
    error: dict[str, Any] = field(default_factory=dict)  # the error's details
    events: list[dict[str, Any]] | None = None  # what a read, tail or copy saw
    record_id: str | None = None  # what an append wrote
    offset: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    exception: BaseException | None = None  # Python: the error raised
    last_error: str | None = None  # a copy's delivery: the subscription's last error
    bodyless: bool = False

    def __str__(self) -> str:
        shown = {k: v for k, v in vars(self).items() if v not in (None, {}, [], False) and k != "headers"}
        return f"Got({shown})"


def http_got(r: httpx.Response) -> Got:
    r.read()
    body: Any = None
    if r.content and r.headers.get("content-type", "").startswith("application/json"):
        body = r.json()
    error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    got = Got(r.status_code, headers={k.lower(): v for k, v in r.headers.items()})
    if error is not None:
        got.code, got.error = error.get("code"), error
    elif r.request.method == "HEAD" and r.status_code >= 400:
        got.bodyless = True
    elif isinstance(body, dict) and isinstance(body.get("events"), list):
        got.events = body["events"]
    elif isinstance(body, dict) and "id" in body:
        got.record_id, got.offset = body["id"], body.get("offset")
    return got


def python_got(run: Callable[[], Any]) -> Got:
    try:
        return run()
    except errors.YokeError as exc:
        return Got(exc.http_status, exc.code, dict(exc.details), exception=exc)


# --- expectations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ok:
    """Done (2xx, no error)."""

    def check(self, world: World, subject: Subject, got: Got) -> None:
        assert 200 <= got.status < 300 and got.code is None, f"expected success, got {got}"


@dataclass(frozen=True)
class Refused:
    """Refused with this status and code; ``details`` and ``headers`` are part
    of the answer; Python raises ``raises``. An answer without a body (HEAD)
    is checked by its status only: there, 403 ``data_handling_pinned`` and
    403 ``forbidden`` look the same."""

    status: int
    code: str
    details: tuple[tuple[str, Any], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    raises: type[errors.YokeError] | None = None

    def check(self, world: World, subject: Subject, got: Got) -> None:
        assert (got.status, got.code if not got.bodyless else self.code) == (self.status, self.code), (
            f"expected {self.status} {self.code}, got {got}"
        )
        for key, value in self.details:
            assert got.error.get(key) == value, f"expected {key}={value!r} in the error, got {got}"
        for key, value in self.headers:
            assert got.headers.get(key) == value, f"expected header {key}: {value}, got {got.headers}"
        if self.raises is not None and got.exception is not None:
            assert isinstance(got.exception, self.raises), f"expected {self.raises.__name__}, got {got.exception!r}"


@dataclass(frozen=True)
class Kept(Refused):
    """A deletion refused by a legal hold: the stream is still there, as it was
    (not deleted, not marked deleted: the protocol reads it, /v1 too)."""

    def check(self, world: World, subject: Subject, got: Got) -> None:
        super().check(world, subject, got)
        assert_kept(world, subject.path)


def assert_kept(world: World, path: str) -> None:
    read = world.admin.get(f"/v1/stream{path}", params={"offset": "-1"})
    assert read.status_code == 200 and read.json()[0] == {"secret": SECRET, "n": 0}, read.text
    info = world.admin.get(f"/v1/streams{path}")
    assert info.status_code == 200 and info.json()["legal_hold"] is True, info.text


@dataclass(frozen=True)
class Sees(Ok):
    """Read: the first record's ``payload.secret`` is ``secret``."""

    secret: str

    def check(self, world: World, subject: Subject, got: Got) -> None:
        super().check(world, subject, got)
        assert got.events, f"expected records, got {got}"
        assert got.events[0]["payload"].get("secret") == self.secret, f"expected {self.secret!r}, got {got.events[0]}"


@dataclass(frozen=True)
class Wakes(Ok):
    """An input record: written, and one ``yoke.input.received`` wake event
    for it on its run's stream ``/runs/{runID}``."""

    def check(self, world: World, subject: Subject, got: Got) -> None:
        super().check(world, subject, got)
        assert got.record_id is not None, f"the append answered no record id: {got}"
        stored = world.app.call(world.app.runtime.stream(subject.path).read(after=got.offset - 1, limit=1))
        assert [e.id for e in stored] == [got.record_id]
        run = f"/v1/streams/runs/{subject.run}/-/events"

        def wakes() -> list[dict[str, Any]]:
            events = world.admin.get(run, params={"after": 0}).json().get("events", [])
            return [e for e in events if e["type"] == "yoke.input.received"
                    and e["payload"].get("record_id") == got.record_id]

        found = until(wakes, f"the wake event of record {got.record_id} on /runs/{subject.run}")
        assert len(found) == 1 and found[0]["payload"]["sequence"] == got.offset, found


@dataclass(frozen=True)
class DeliveryFails:
    """A copy subscription configured (Python): its delivery into the target
    fails with ``error``, which its status's last error names."""

    error: type[errors.YokeError]

    def check(self, world: World, subject: Subject, got: Got) -> None:
        assert got.status == 200 and got.last_error is not None, f"expected a failing delivery, got {got}"
        assert got.last_error.startswith(f"{self.error.__name__}: "), (
            f"expected {self.error.__name__} ({self.error.code}), got {got.last_error!r}"
        )


def until(probe: Callable[[], Any], what: str, timeout_s: float = 15.0) -> Any:
    """``probe()`` once it is truthy, within a deadline (polled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


OK = Ok()
PINNED = Refused(403, "data_handling_pinned")
FORBIDDEN = Refused(403, "forbidden", details=(("pinned", True),))
EGRESS = Refused(403, "egress_refused")
CLASS_REFUSED = Refused(400, "content_class_refused", raises=errors.ContentClassRefused)
HELD = Kept(409, "legal_hold", raises=errors.LegalHold)
CLOSED = Refused(409, "stream_closed", raises=errors.StreamClosed)
DS_CLOSED = Refused(409, "stream_closed", headers=(("stream-closed", "true"),))
GONE = Refused(410, "cursor_gone", raises=errors.CursorGone)


# --- subjects: a fresh stream per rule ----------------------------------------------------


@dataclass
class Subject:
    run: str
    name: str
    after: int = 0  # where reads start (offset > after)
    ds_from: str = "-1"  # the same for a protocol read (and fork_at: a fork at that offset)

    @classmethod
    def new(cls, name: str) -> Subject:
        return cls("run-" + uuid.uuid4().hex[:10], name)

    @property
    def path(self) -> str:
        return f"/runs/{self.run}/{self.name}"

    @property
    def v1(self) -> str:
        return f"/v1/streams{self.path}"

    @property
    def ds(self) -> str:
        return f"/v1/stream{self.path}"

    @property
    def workflow(self) -> str:
        return f"/api/workflow-streams/runs/{self.run}/streams/{self.name}"


SECRET = "s3cr3t"
SEED = {"type": "seed", "payload": {"secret": SECRET, "n": 0}, "metadata": {"content_class": "model_output"}}
RECORD = {"type": "t", "payload": {"n": 1}}  # declares no content class
CLASSIFIED = {"type": "t", "payload": {"n": 2}, "metadata": {"content_class": "model_output"}}


def token(offset: int) -> str:
    """A protocol offset token (durable_streams/offsets.py)."""
    return f"{offset:016d}_0000000000000000"


def defined(**definition: Any) -> Callable[[World, bool], Subject]:
    """A workflow stream with this definition, holding the seed record (appended by the application)."""

    def make(world: World, settle: bool) -> Subject:
        subject = Subject.new("s")
        r = world.admin.post(f"/api/workflow-streams/runs/{subject.run}/streams",
                             json={"stream_id": subject.name, **definition})
        assert r.status_code == 201, r.text
        world.app.call(world.app.runtime.stream(subject.path).append(SEED))
        return subject

    return make


def protocol_stream(then: Callable[[World, Subject], None]) -> Callable[[World, bool], Subject]:
    """A plain stream created by a protocol PUT (JSON, one message), then ``then``."""

    def make(world: World, settle: bool) -> Subject:
        subject = Subject.new("p")
        r = world.admin.put(subject.ds, headers={"Content-Type": "application/json"},
                            content=orjson.dumps([{"secret": SECRET, "n": 0}]))
        assert r.status_code == 201, r.text
        then(world, subject)
        return subject

    return make


def hold(world: World, subject: Subject) -> None:
    r = world.admin.put(f"{subject.v1}/-/legal-hold", json={"on": True})
    assert r.status_code == 200 and r.json()["legal_hold"] is True, r.text


def fork_and_hold(world: World, subject: Subject) -> None:
    """A fork of the stream lives (a protocol DELETE would only mark it deleted), then the hold."""
    r = world.admin.put(f"/v1/stream{unique('fork')}", headers={"Stream-Forked-From": subject.path})
    assert r.status_code == 201, r.text
    hold(world, subject)


def close(world: World, subject: Subject) -> None:
    r = world.admin.post(f"{subject.v1}/-/close")
    assert r.status_code == 200 and r.json()["closed"] is True, r.text


def pruned(world: World, settle: bool) -> Subject:
    """A definition keeping one event (max_events=1), three appended: the
    first two pruned (the server prunes every 0.2 s)."""
    subject = Subject.new("r")
    r = world.admin.post(f"/api/workflow-streams/runs/{subject.run}/streams",
                         json={"stream_id": subject.name, "retention": {"max_events": 1}})
    assert r.status_code == 201, r.text
    r = world.admin.post(f"{subject.workflow}/records", json=[{"type": "t", "payload": i} for i in range(3)])
    assert r.status_code == 201, r.text
    subject.ds_from = token(1)  # an explicit offset before the earliest (3)
    if settle:
        until(lambda: world.admin.get(subject.v1).json()["earliest"] == 3, "retention to prune the stream")
    return subject


RULES: dict[str, Callable[[World, bool], Subject]] = {
    "authorization": defined(authorization={"read": {"scopes": ["run:read"]}, "append": {"scopes": ["run:write"]}}),
    "redaction": defined(redaction=[{"path": "$.payload.secret", "lifted_by": ["pii:read"]}]),
    "egress": defined(placement={"client_egress_regions": ["eu-west-1"]}),
    "content_classes": defined(content_classes=["model_output"]),
    "input": defined(direction="input"),
    "legal_hold": protocol_stream(hold),
    "legal_hold_forked": protocol_stream(fork_and_hold),  # finding 4: a held stream with forks
    "closed": protocol_stream(close),
    "retention": pruned,
}

# Who asks: the token's scopes ("": the server's admin token) and the headers sent.
CALLERS: dict[str, tuple[str, dict[str, str]]] = {
    "admin": ("", {}),
    "run": ("read,append,run:read,run:write", {}),
    "plain": ("read,append", {}),
    "pii": ("read,append,pii:read", {}),
    "us": ("", {"Client-Region": "us-east-1"}),
    "eu": ("", {"Client-Region": "eu-west-1"}),
    "app": ("", {}),  # the application (Python): no token
}


class World:
    """One backend's server, the application on its database, tokens,
    clients and the rules' streams."""

    def __init__(self, server: Server, app: App) -> None:
        self.server = server
        self.app = app
        self.admin = server.client()
        self._tokens: dict[str, str] = {"": server.token}
        self._clients: dict[tuple[str, str], httpx.Client] = {}
        self._subjects: dict[str, Subject] = {}

    def token(self, caller: str) -> str:
        scopes = CALLERS[caller][0]
        if scopes not in self._tokens:
            self._tokens[scopes] = self.server.new_token("default", scopes)
        return self._tokens[scopes]

    def client(self, surface: str, caller: str) -> httpx.Client:
        """A client of ``surface`` as ``caller``: a bearer token, or (console) the session cookie."""
        key = (surface, caller)
        if key not in self._clients:
            headers = dict(CALLERS[caller][1])
            if surface == "console":
                client = httpx.Client(base_url=self.server.url, timeout=15)
                signed = client.post("/ui/session", json={"token": self.token(caller)})
                assert signed.status_code == 200, signed.text
                headers["X-Yoke-CSRF"] = signed.json()["csrf"]
                client.headers.update(headers)
            else:
                client = self.server.client(self.token(caller))
                client.timeout = httpx.Timeout(15)
                client.headers.update(headers)
            self._clients[key] = client
        return self._clients[key]

    def subject(self, rule: str, fresh: bool = False) -> Subject:
        if fresh:
            return RULES[rule](self, False)
        if rule not in self._subjects:
            self._subjects[rule] = RULES[rule](self, True)
        return self._subjects[rule]

    def close(self) -> None:
        for client in [self.admin, *self._clients.values()]:
            client.close()


# --- the surfaces' operations ------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"/t/{prefix}-{uuid.uuid4().hex[:10]}"


def sse_first(client: httpx.Client, url: str, params: dict[str, Any], protocol: bool = False) -> Got:
    """The first frame of a tail (SSE), or the refusal answered before it."""
    with connect_sse(client, "GET", url, params=params) as source:
        if source.response.status_code != 200:
            return http_got(source.response)
        for frame in source.iter_sse():
            if not frame.data:
                continue
            data = orjson.loads(frame.data)
            if protocol:  # Durable Streams: data frames hold arrays of messages, then control frames
                if frame.event == "data":
                    return Got(200, events=[{"payload": m} for m in data])
                continue
            if frame.event == "error" or (isinstance(data, dict) and "error" in data and "offset" not in data):
                error = data.get("error", data)
                return Got(200, error.get("code", "error"), error)
            return Got(200, events=[data])
    return Got(200, events=[])


def copy_body(target: str) -> dict[str, Any]:
    return {"name": "m-" + uuid.uuid4().hex[:8], "receiver": {"kind": "copy", "target": target}, "start": "beginning"}


V1_OPS: dict[str, Callable[[httpx.Client, Subject], Got]] = {
    "read": lambda c, s: http_got(c.get(f"{s.v1}/-/events", params={"after": s.after})),
    "tail": lambda c, s: sse_first(c, f"{s.v1}/-/tail", {"after": s.after}),
    "head": lambda c, s: http_got(c.get(s.v1)),
    "append": lambda c, s: http_got(c.post(f"{s.v1}/-/events", json=RECORD)),
    "append_classified": lambda c, s: http_got(c.post(f"{s.v1}/-/events", json=CLASSIFIED)),
    "copy_from": lambda c, s: http_got(c.post(f"{s.v1}/-/subscriptions", json=copy_body(unique("copy")))),
    "copy_into": lambda c, s: http_got(c.post(f"/v1/streams{unique('source')}/-/subscriptions",
                                              json=copy_body(s.path))),
    "delete": lambda c, s: http_got(c.delete(s.v1)),
}

JSON = {"Content-Type": "application/json"}
DS_OPS: dict[str, Callable[[httpx.Client, Subject], Got]] = {
    "read": lambda c, s: http_got(c.get(s.ds, params={"offset": s.ds_from})),
    "sse": lambda c, s: sse_first(c, s.ds, {"offset": s.ds_from, "live": "sse"}, protocol=True),
    "long_poll": lambda c, s: http_got(c.get(s.ds, params={"offset": s.ds_from, "live": "long-poll"})),
    "head": lambda c, s: http_got(c.head(s.ds)),
    "append": lambda c, s: http_got(c.post(s.ds, headers=JSON, content=b'{"n": 1}')),
    "fork": lambda c, s: http_got(c.put(f"/v1/stream{unique('fork')}", headers={"Stream-Forked-From": s.path})),
    "fork_at": lambda c, s: http_got(c.put(f"/v1/stream{unique('fork')}", headers={
        "Stream-Forked-From": s.path, "Stream-Fork-Offset": s.ds_from,
    })),
    "delete": lambda c, s: http_got(c.delete(s.ds)),
}

WORKFLOW_OPS: dict[str, Callable[[httpx.Client, Subject], Got]] = {
    "read": lambda c, s: http_got(c.get(f"{s.workflow}/records", params={"cursor": s.after})),
    "tail": lambda c, s: sse_first(c, f"{s.workflow}/subscribe", {"cursor": s.after}),
    "head": lambda c, s: http_got(c.get(s.workflow)),
    "append": lambda c, s: http_got(c.post(f"{s.workflow}/records", json=RECORD)),
    "append_classified": lambda c, s: http_got(c.post(f"{s.workflow}/records", json=CLASSIFIED)),
}

CLI_ERROR = re.compile(r"^error: ([a-z_]+) \((\d{3})\)", re.M)


def cli(world: World, caller: str, *args: str) -> Got:
    done = world.server.cli(*args, "--json", "--url", world.server.url, "--token", world.token(caller), check=False)
    if done.returncode == 0:
        body = orjson.loads(done.stdout)
        return Got(200, events=body.get("events"), record_id=body.get("id"), offset=body.get("offset"))
    match = CLI_ERROR.search(done.stderr)
    assert match is not None, f"the CLI failed without an error code: {done.stderr}"
    return Got(int(match.group(2)), match.group(1))


CLI_OPS: dict[str, Callable[[World, str, Subject], Got]] = {
    "read": lambda w, c, s: cli(w, c, "read", s.path, "--after", str(s.after)),
    "head": lambda w, c, s: cli(w, c, "stream", "info", s.path),
    "append": lambda w, c, s: cli(w, c, "append", s.path, RECORD["type"], orjson.dumps(RECORD["payload"]).decode()),
    "delete": lambda w, c, s: cli(w, c, "stream", "delete", s.path, "--yes"),
}


async def py_tail(y: Any, s: Subject) -> Got:
    async with asyncio.timeout(10):
        async for event in y.stream(s.path).tail(after=s.after):
            return Got(200, events=[event.to_dict()])
    return Got(200, events=[])


async def py_append(y: Any, s: Subject, record: dict[str, Any]) -> Got:
    result = await y.stream(s.path).append(record)
    return Got(200, record_id=result.id, offset=result.offset)


async def py_copy_from(y: Any, s: Subject) -> Got:
    """Copy the subject's records into a new stream, delivered (waited for)."""
    source, target, name = y.stream(s.path), unique("copy"), "m-" + uuid.uuid4().hex[:8]
    await source.subscribe(name, yoke.copy_to_stream(target), start="beginning")
    await source.wait_until_processed(name, (await source.info()).head, timeout_s=15)
    return Got(200, events=[e.to_dict() for e in await y.stream(target).read()])


async def py_copy_into(y: Any, s: Subject) -> Got:
    """Copy a record that declares no content class from a new stream into
    the subject: delivered (its status processed through it), or its
    delivery fails (the status's last error), within a deadline."""
    source, name = y.stream(unique("source")), "m-" + uuid.uuid4().hex[:8]
    await source.subscribe(name, yoke.copy_to_stream(s.path), start="beginning")
    appended = await source.append(RECORD)
    deadline = time.monotonic() + 15
    while True:
        status = await source.subscription(name)
        if status.last_error is not None:
            return Got(200, last_error=status.last_error)
        if status.processed_through_offset >= appended.offset:
            return Got(200)
        if time.monotonic() > deadline:
            raise AssertionError(f"copy {name} neither delivered nor failed: {status}")
        await asyncio.sleep(0.05)  # polling the subscription's status


async def py_read(y: Any, s: Subject) -> Got:
    return Got(200, events=[e.to_dict() for e in await y.stream(s.path).read(after=s.after)])


async def py_head(y: Any, s: Subject) -> Got:
    await y.stream(s.path).info()
    return Got(200)


async def py_delete(y: Any, s: Subject) -> Got:
    await y.stream(s.path).delete()
    return Got(200)


PYTHON_OPS: dict[str, Callable[[Any, Subject], Any]] = {
    "read": py_read,
    "tail": py_tail,
    "head": py_head,
    "append": lambda y, s: py_append(y, s, RECORD),
    "append_classified": lambda y, s: py_append(y, s, CLASSIFIED),
    "copy_from": py_copy_from,
    "copy_into": py_copy_into,
    "delete": py_delete,
}


def run_http(ops: dict[str, Callable[[httpx.Client, Subject], Got]]) -> Callable[[World, str, str, str, Subject], Got]:
    return lambda w, surface, caller, op, s: ops[op](w.client(surface, caller), s)


def run_python(w: World, surface: str, caller: str, op: str, s: Subject) -> Got:
    return python_got(lambda: w.app.call(PYTHON_OPS[op](w.app.runtime, s)))


SURFACES: dict[str, tuple[Callable[[World, str, str, str, Subject], Got], tuple[str, ...]]] = {
    "v1": (run_http(V1_OPS), tuple(V1_OPS)),
    "console": (run_http(V1_OPS), ("read", "tail", "append", "delete")),
    "ds": (run_http(DS_OPS), tuple(DS_OPS)),
    "workflow": (run_http(WORKFLOW_OPS), tuple(WORKFLOW_OPS)),
    "cli": (lambda w, surface, caller, op, s: CLI_OPS[op](w, caller, s), tuple(CLI_OPS)),
    "python": (run_python, tuple(PYTHON_OPS)),
}
DESTRUCTIVE = {"delete"}  # each on a fresh stream of its rule


# --- the matrix -------------------------------------------------------------------------------


def every(surface: str, expected: Any, *, but: tuple[str, ...] = (), **cells: Any) -> dict[str, Any]:
    """``expected`` for each operation of ``surface`` (except ``but``), ``cells`` overriding."""
    ops = SURFACES[surface][1]
    return {**{op: expected for op in ops if op not in but and not op.startswith("append_")}, **cells}


def generic_refuses(rule: str, caller: str = "admin") -> list[tuple[str, str, str, dict[str, Any]]]:
    """A stream that pins data handling, refused on every generic surface, every operation."""
    return [
        (rule, "v1", caller, every("v1", PINNED)),
        (rule, "console", caller, every("console", PINNED)),
        (rule, "ds", caller, every("ds", PINNED)),
        (rule, "cli", "admin", every("cli", PINNED)),  # the CLI declares no region
    ]


TABLE: list[tuple[str, str, str, dict[str, Any]]] = [
    # rule, surface, caller, {operation: expected}
    ("authorization", "workflow", "admin", every("workflow", FORBIDDEN)),
    ("authorization", "workflow", "run", every("workflow", OK)),
    *generic_refuses("authorization"),
    ("authorization", "v1", "run", {"read": PINNED, "append": PINNED}),  # the scopes do not open /v1
    ("authorization", "python", "app", every("python", OK)),

    ("redaction", "workflow", "plain", {"read": Sees("[redacted]"), "tail": Sees("[redacted]"), "head": OK, "append": OK}),
    ("redaction", "workflow", "pii", {"read": Sees(SECRET), "tail": Sees(SECRET)}),
    *generic_refuses("redaction"),
    ("redaction", "python", "app", every("python", OK, read=Sees(SECRET), tail=Sees(SECRET), copy_from=Sees(SECRET))),

    ("egress", "workflow", "us", every("workflow", EGRESS)),
    ("egress", "workflow", "eu", every("workflow", OK)),
    *generic_refuses("egress", "us"),
    ("egress", "python", "app", every("python", OK)),

    ("content_classes", "workflow", "admin", every("workflow", OK, append=CLASS_REFUSED, append_classified=OK)),
    *generic_refuses("content_classes"),
    ("content_classes", "v1", "admin", {"append_classified": PINNED}),
    ("content_classes", "python", "app", every(
        "python", OK, append=CLASS_REFUSED, append_classified=OK, copy_into=DeliveryFails(errors.ContentClassRefused),
    )),

    ("input", "workflow", "admin", every("workflow", OK, append=Wakes())),
    *generic_refuses("input"),
    # A copy is not an input record with its outbox: its delivery into an input stream fails.
    ("input", "python", "app", every("python", OK, append=Wakes(), copy_into=DeliveryFails(errors.DataHandlingPinned))),

    ("legal_hold", "v1", "admin", every("v1", OK, but=("copy_from", "copy_into"), delete=HELD)),
    ("legal_hold", "console", "admin", every("console", OK, delete=HELD)),
    ("legal_hold", "ds", "admin", every("ds", OK, delete=HELD)),
    ("legal_hold", "cli", "admin", every("cli", OK, delete=HELD)),
    ("legal_hold", "workflow", "admin", every("workflow", OK)),
    ("legal_hold", "python", "app", every("python", OK, but=("copy_from", "copy_into"), delete=HELD)),

    # Held with a fork: the protocol's DELETE would mark it deleted; the hold refuses that too.
    ("legal_hold_forked", "v1", "admin", {"read": OK, "head": OK, "delete": HELD}),
    ("legal_hold_forked", "ds", "admin", every("ds", OK, delete=HELD)),
    ("legal_hold_forked", "cli", "admin", {"delete": HELD}),
    ("legal_hold_forked", "python", "app", {"read": OK, "delete": HELD}),

    ("closed", "v1", "admin", every("v1", OK, but=("copy_from", "copy_into"), append=CLOSED)),
    ("closed", "console", "admin", every("console", OK, append=CLOSED)),
    ("closed", "ds", "admin", every("ds", OK, append=DS_CLOSED)),
    ("closed", "cli", "admin", every("cli", OK, append=CLOSED)),
    ("closed", "workflow", "admin", every("workflow", OK, append=CLOSED)),
    ("closed", "python", "app", every("python", OK, but=("copy_from", "copy_into"), append=CLOSED)),

    # Reads start after 0 (the protocol: at an explicit offset before the earliest).
    ("retention", "v1", "admin", every("v1", OK, but=("copy_from", "copy_into"), read=GONE, tail=GONE)),
    ("retention", "console", "admin", every("console", OK, read=GONE, tail=GONE)),
    ("retention", "ds", "admin", every("ds", OK, read=GONE, sse=GONE, long_poll=GONE, fork_at=GONE)),
    ("retention", "cli", "admin", every("cli", OK, read=GONE)),
    ("retention", "workflow", "admin", every("workflow", OK, read=GONE, tail=GONE)),
    ("retention", "python", "app", every("python", OK, but=("copy_from", "copy_into"), read=GONE, tail=GONE)),
]

# Cells whose answer is not the expected one yet: cell id -> what it answers.
XFAIL: dict[str, str] = {}


@dataclass(frozen=True)
class Cell:
    rule: str
    surface: str
    caller: str
    op: str
    expected: Any

    @property
    def id(self) -> str:
        return f"{self.rule}-{self.surface}-{self.caller}-{self.op}"


def cells() -> Iterator[Any]:
    """The table's cells in order (destructive operations last within a rule)."""
    listed = [Cell(rule, surface, caller, op, expected)
              for rule, surface, caller, ops in TABLE for op, expected in ops.items()]
    for rule in RULES:
        mine = [c for c in listed if c.rule == rule]
        for cell in sorted(mine, key=lambda c: c.op in DESTRUCTIVE):
            assert cell.op in SURFACES[cell.surface][1], cell.id
            marks = [pytest.mark.xfail(strict=True, reason=XFAIL[cell.id])] if cell.id in XFAIL else []
            yield pytest.param(cell, id=cell.id, marks=marks)


@pytest.fixture(scope="module")
def world(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    app = App(server.db_url, tmp_path_factory.mktemp("app"))
    w = World(server, app)
    try:
        yield w
    finally:
        w.close()
        app.close()


@pytest.mark.parametrize("cell", list(cells()))
def test_rule_matrix(world: World, cell: Cell) -> None:
    subject = world.subject(cell.rule, fresh=cell.op in DESTRUCTIVE)
    run, _ = SURFACES[cell.surface]
    got = run(world, cell.surface, cell.caller, cell.op, subject)
    cell.expected.check(world, subject, got)


# --- legal hold: the protocol's sequences (forks, chains, TTL) and retention ---------------------


def ds_status(world: World, path: str, method: str = "GET") -> int:
    return world.admin.request(method, f"/v1/stream{path}", params={"offset": "-1"} if method == "GET" else None).status_code


def ds_put(world: World, path: str, **headers: str) -> None:
    r = world.admin.put(f"/v1/stream{path}", headers={"Content-Type": "application/json", **headers},
                        content=orjson.dumps([{"secret": SECRET, "n": 0}]))
    assert r.status_code == 201, r.text


def ds_fork(world: World, source: str) -> str:
    fork = unique("fork")
    r = world.admin.put(f"/v1/stream{fork}", headers={"Stream-Forked-From": source})
    assert r.status_code == 201, r.text
    return fork


def set_hold(world: World, path: str, on: bool) -> None:
    r = world.admin.put(f"/v1/streams{path}/-/legal-hold", json={"on": on})
    assert r.status_code == 200 and r.json()["legal_hold"] is on, r.text


def ds_delete(world: World, path: str) -> tuple[int, str | None]:
    r = world.admin.delete(f"/v1/stream{path}")
    return r.status_code, r.json()["error"]["code"] if r.content else None


def test_a_held_source_with_a_fork_stays_and_its_fork_can_go(world: World) -> None:
    """Finding 4: the held source answered 204 then 410, and its fork could no longer be deleted."""
    source = unique("held")
    ds_put(world, source)
    fork = ds_fork(world, source)
    set_hold(world, source, True)
    assert ds_delete(world, source) == (409, "legal_hold")
    assert ds_delete(world, source) == (409, "legal_hold")  # not marked deleted by the first
    assert_kept(world, source)
    assert ds_status(world, source, "HEAD") == 200
    assert ds_delete(world, fork) == (204, None)  # the unheld fork goes
    assert ds_status(world, fork) == 404
    assert ds_delete(world, source) == (409, "legal_hold")  # and without forks, the same answer
    assert_kept(world, source)
    set_hold(world, source, False)
    assert ds_delete(world, source) == (204, None)
    assert ds_status(world, source) == 404


def test_a_chain_of_forks_held_in_the_middle(world: World) -> None:
    """a <- b <- c, b held: b is never deleted nor marked, whatever is deleted around it."""
    a = unique("a")
    ds_put(world, a)
    b = ds_fork(world, a)
    c = ds_fork(world, b)
    set_hold(world, b, True)
    assert ds_delete(world, b) == (409, "legal_hold")  # held, with a fork
    assert_kept(world, b)
    assert ds_delete(world, a) == (204, None)  # a is not held: marked deleted while b lives
    assert ds_status(world, a) == 410
    assert ds_delete(world, c) == (204, None)  # c goes; the chain stops at b (not marked)
    assert ds_status(world, c) == 404
    assert_kept(world, b)
    assert ds_status(world, a) == 410  # b still lives on a
    assert ds_delete(world, b) == (409, "legal_hold")  # held, without forks now
    assert_kept(world, b)
    assert ds_delete(world, b) == (409, "legal_hold")
    set_hold(world, b, False)
    assert ds_delete(world, b) == (204, None)  # b goes, and with it a, marked and fork-less now
    assert (ds_status(world, b), ds_status(world, a)) == (404, 404)


def test_a_chain_whose_marked_source_is_held_afterwards(world: World) -> None:
    """a <- b: a marked deleted (its fork lives), then held; b's deletion may not take a with it."""
    a = unique("a")
    ds_put(world, a)
    b = ds_fork(world, a)
    assert ds_delete(world, a) == (204, None)
    set_hold(world, a, True)
    assert ds_delete(world, b) == (204, None)
    assert ds_status(world, b) == 404
    info = world.admin.get(f"/v1/streams{a}")  # a stays, with its records (still marked deleted)
    assert info.status_code == 200 and info.json()["legal_hold"] is True, info.text
    assert len(world.admin.get(f"/v1/streams{a}/-/events", params={"after": 0}).json()["events"]) == 1


def test_a_held_stream_outlives_its_ttl(world: World) -> None:
    held, control = unique("held-ttl"), unique("ttl")
    ds_put(world, held, **{"Stream-TTL": "1"})
    set_hold(world, held, True)
    ds_put(world, control, **{"Stream-TTL": "1"})  # created after: it expires after the held one would
    # HEAD does not restart a TTL window: the control stream expires once its second has passed.
    until(lambda: ds_status(world, control, "HEAD") == 404, "the unheld stream to expire")
    assert ds_status(world, held, "HEAD") == 200
    assert_kept(world, held)
    r = world.admin.put(f"/v1/stream{held}", headers={"Content-Type": "application/json", "Stream-TTL": "1"})
    assert r.status_code == 200, r.text  # the same stream, not a new one where an expired one was


def test_retention_prunes_nothing_while_held(world: World) -> None:
    held, control = unique("held-retention"), unique("retention")
    for path in (held, control):
        ds_put(world, path)
        r = world.admin.post(f"/v1/streams{path}/-/events", json=[{"type": "t", "payload": i} for i in (1, 2)])
        assert r.status_code == 201, r.text
    set_hold(world, held, True)
    # The held stream's retention first: every pruning pass that sees the control's sees it too.
    for path in (held, control):
        r = world.admin.put(f"/v1/streams{path}/-/retention", json={"max_events": 1})
        assert r.status_code == 200, r.text
    until(lambda: world.admin.get(f"/v1/streams{control}").json()["earliest"] == 3, "retention to prune")
    info = world.admin.get(f"/v1/streams{held}").json()
    assert (info["earliest"], info["head"], info["usage"]["durable_events"]) == (1, 3, 3)
    assert len(world.admin.get(f"/v1/streams{held}/-/events", params={"after": 0}).json()["events"]) == 3
    assert len(world.admin.get(f"/v1/stream{held}", params={"offset": "-1"}).json()) == 3
    set_hold(world, held, False)  # lifted: pruned as any other
    until(lambda: world.admin.get(f"/v1/streams{held}").json()["earliest"] == 3, "retention to prune once lifted")


def test_a_protocol_read_from_the_beginning_starts_at_what_retention_kept(world: World) -> None:
    """`offset=-1` is the beginning of the stream (the protocol's sentinel):
    of a pruned stream, its earliest kept message, not 410 forever; an
    explicit offset before it is still 410."""
    path = unique("pruned-start")
    ds_put(world, path)
    r = world.admin.post(f"/v1/streams{path}/-/events", json=[{"type": "t", "payload": i} for i in range(3)])
    assert r.status_code == 201, r.text
    assert world.admin.put(f"/v1/streams{path}/-/retention", json={"max_events": 1}).status_code == 200
    until(lambda: world.admin.get(f"/v1/streams{path}").json()["earliest"] == 4, "retention to prune")
    r = world.admin.get(f"/v1/stream{path}", params={"offset": "-1"})  # the PUT's message and three
    assert r.status_code == 200 and [m["payload"] for m in r.json()] == [2], r.text
    assert r.headers["stream-next-offset"] == token(4)
    r = world.admin.get(f"/v1/stream{path}", params={"offset": "-1", "live": "long-poll"})
    assert r.status_code == 200 and [m["payload"] for m in r.json()] == [2], r.text
    assert world.admin.get(f"/v1/stream{path}", params={"offset": token(1)}).status_code == 410
