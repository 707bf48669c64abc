"""Every route, every parameter, values outside the domain: never a 5xx.

Against a real ``yoke serve --app tests.http.console_app:app`` per backend,
the test reads the served OpenAPI document and, for every operation, sends
requests that differ from a valid base request in one place: a path, query
or header parameter, a top-level body field, a field one level down, or a
list's first item, set to an integer just past signed 64 bits or past 64
bits (either sign), to the signed 64-bit extremes, or to a text holding NUL
or a lone surrogate (text neither store can hold). The base request names
things that exist (a stream with events, a consumer, a subscription halted
on a webhook, an instance with a dead letter, a workflow stream, a Durable
Streams stream with an idempotent producer), so a probe gets as far into
the route as its value lets it. Any 5xx (or a connection the server
dropped) fails the test, listing every offender; a parameter or field
declared an integer must refuse an out-of-range value (4xx).

A NUL cannot travel in a header (the HTTP parser refuses it), so header
probes of text go over a raw socket, to show that refusal is a 4xx too.

The table is the document: a route added later is probed without a new row
here. Probes run concurrently; DELETE operations run last, so that a probe
a route accepted cannot take a later probe's base away.
"""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from yoke.events import MAX_INT, MIN_INT
from yoke.http.app import create_app

from .conftest import CONSOLE_APP, CONSOLE_FAST, Server, own_database, start_server, stop_server
from .test_actors_api import wait_for

OUT_OF_RANGE: list[Any] = [MAX_INT + 1, MIN_INT - 1, 2**64, -(2**64)]
PROBES: list[Any] = [*OUT_OF_RANGE, MAX_INT, MIN_INT, "a\x00b", "a\ud800b"]
STREAM = "/dom/s"
RUN, WORKFLOW_STREAM, DS_NAME = "run1", "s1", "dom-ds"
NOWHERE = "http://127.0.0.1:9/hook"  # the discard port: a webhook there fails at once
# Valid values of the path parameters (instance_id and failure_id: found at setup).
PATH_BASE = {
    "path": STREAM, "runID": RUN, "streamID": WORKFLOW_STREAM, "consumer": "c1", "consumerID": "c1",
    "offset": "1", "sequence": "1", "object_id": "o1", "objectID": "o1", "token_id": "t1", "rest": "x",
}
# Required query parameters (and a wait that returns at once).
QUERY_BASE = {"name": "sub", "key": "k", "timeout_s": "0"}
# A Durable Streams append as an idempotent producer (its numbers probed one by one).
DS_PRODUCER = {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "0"}


@dataclass
class Probe:
    method: str
    template: str  # the operation's path in the document
    where: str  # path, query, header, body
    name: str
    value: Any
    url: str  # with its query string
    headers: dict[str, str]
    body: bytes | None
    integer: bool  # declared an integer, and the value is out of range: 400 expected

    def label(self) -> str:
        return f"{self.method} {self.template} {self.where} {self.name}={self.value!r}"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("domains")
    with own_database(request.param, base, "yoke_domains") as db_url:
        srv = start_server(db_url, base / ".yoke", args=("--app", CONSOLE_APP), **CONSOLE_FAST)
        try:
            yield srv
        finally:
            stop_server(srv)


def set_up(http: httpx.Client) -> dict[str, str]:
    """Things for the base requests to name; the path parameters' base values."""

    def ok(response: httpx.Response) -> Any:
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    entries = [{"type": "ledger.entry", "payload": {"n": n}} for n in range(3)]
    ok(http.post(f"/v1/streams{STREAM}/-/events", json=entries))
    ok(http.post(f"/v1/streams{STREAM}/-/subscriptions",
                 json={"name": "sub", "receiver": {"kind": "copy", "target": "/dom/copy"}, "start": "beginning"}))
    ok(http.post(f"/v1/streams{STREAM}/-/subscriptions",
                 json={"name": "hook", "receiver": {"kind": "webhook", "url": NOWHERE}, "start": "beginning"}))
    ok(http.post(f"/v1/streams{STREAM}/-/consumers/c1/ack", json={"offset": 1}))
    ok(http.post("/v1/streams/dom/jobs/-/events", json={"type": "flaky.fail"}))
    ok(http.post(f"/api/workflow-streams/runs/{RUN}/streams", json={"stream_id": WORKFLOW_STREAM}))
    ok(http.post(f"/api/workflow-streams/runs/{RUN}/streams/{WORKFLOW_STREAM}/records", json={"type": "x"}))
    ok(http.put(f"/v1/stream/{DS_NAME}", headers={"Content-Type": "application/json"}, content=b"[]"))
    parked = wait_for(lambda: {f["kind"]: f for f in ok(http.get("/v1/failures"))["failures"]}.keys()
                      >= {"dead_letter", "halted"} and ok(http.get("/v1/failures"))["failures"], "two failures")
    dead = next(f for f in parked if f["kind"] == "dead_letter")
    return {**PATH_BASE, "instance_id": dead["instance_id"], "failure_id": dead["id"]}


# --- the table, from the document ---------------------------------------------------------


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def alternatives(doc: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The schemas a schema allows: itself, and each of its anyOf / oneOf, resolved."""
    schema = resolve(doc, schema)
    options = schema.get("anyOf", []) + schema.get("oneOf", [])
    return [schema] + [s for option in options for s in alternatives(doc, option)]


def is_integer(doc: dict[str, Any], schema: dict[str, Any]) -> bool:
    return any(s.get("type") == "integer" for s in alternatives(doc, schema))


def base_body(doc: dict[str, Any], operation: dict[str, Any]) -> tuple[str | None, Any, dict[str, set[str]], set[str]]:
    """The operation's first request body type and its first example; the
    top-level fields its schema and examples name, each with the fields it
    holds (an object's); the fields (``a`` or ``a.b``) declared integers."""
    content = operation.get("requestBody", {}).get("content", {})
    if not content:
        return None, None, {}, set()
    media_type, spec = next(iter(content.items()))
    examples = [e["value"] for e in spec.get("examples", {}).values()]
    if "example" in spec:
        examples.insert(0, spec["example"])
    fields: dict[str, set[str]] = {}
    integers: set[str] = set()
    for schema in alternatives(doc, spec.get("schema", {})):
        for name, field_schema in schema.get("properties", {}).items():
            fields.setdefault(name, set())
            integers |= {name} if is_integer(doc, field_schema) else set()
            for inner in alternatives(doc, field_schema):
                for key, inner_schema in inner.get("properties", {}).items():
                    fields[name].add(key)
                    integers |= {f"{name}.{key}"} if is_integer(doc, inner_schema) else set()
    objects = [e for e in examples if isinstance(e, dict)]
    for example in objects:
        for name, value in example.items():
            fields.setdefault(name, set()).update(value if isinstance(value, dict) else ())
    base = objects[0] if objects and media_type == "application/json" else (examples[0] if examples else None)
    return media_type, base, fields, integers


def body_variants(base: dict[str, Any], fields: dict[str, set[str]], value: Any) -> Iterator[tuple[str, Any]]:
    """``base`` with one field (or a field's field, or a list's item) set to ``value``."""
    for name, inner_fields in sorted(fields.items()):
        yield name, {**base, name: value}
        inner = base.get(name)
        if isinstance(inner, list):
            yield f"{name}[0]", {**base, name: [value, *inner[1:]]}
        elif inner_fields:
            inner = inner if isinstance(inner, dict) else {}
            for key in sorted(inner_fields):
                yield f"{name}.{key}", {**base, name: {**inner, key: value}}


def escaped(text: str) -> str:
    """URL encoding of any text, a lone surrogate included (as its UTF-8-like bytes)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def dumps(value: Any) -> bytes:
    """JSON text, integers of any size exact and lone surrogates escaped (orjson refuses both)."""
    return json.dumps(value).encode()


def probes(doc: dict[str, Any], path_base: dict[str, str]) -> list[Probe]:
    table: list[Probe] = []
    fresh = itertools.count()
    for template, operations in doc["paths"].items():
        for method, operation in operations.items():
            params = operation.get("parameters", [])
            protocol = template.startswith("/v1/stream/")
            base_path = {p["name"]: path_base.get(p["name"], "x") for p in params if p["in"] == "path"}
            if "name" in base_path:
                base_path["name"] = DS_NAME if protocol else "p"  # portals: none in this app
            base_query = {p["name"]: QUERY_BASE[p["name"]] for p in params
                          if p["in"] == "query" and p["name"] in QUERY_BASE}
            media_type, body, fields, integers = base_body(doc, operation)
            base_headers = {"Content-Type": media_type} if media_type else {}
            if protocol:  # a JSON stream; creating one: a fork of DS_NAME under a new name each time
                base_headers = {"Content-Type": "application/json"}
                body, fields = ([{"n": 1}] if method in ("post", "put") else None), {}
                if method == "post":
                    base_headers.update(DS_PRODUCER)
                if method == "put":
                    base_headers["Stream-Forked-From"] = f"/v1/stream/{DS_NAME}"
            raw_body = dumps(body) if media_type == "application/json" and body is not None else (
                body.encode() if isinstance(body, str) else None)

            def probe(where: str, name: str, value: Any, path: dict[str, str] | None = None,
                      query: dict[str, str] | None = None, headers: dict[str, str] | None = None,
                      content: bytes | None = None, integer: bool = False) -> Probe:
                path = dict(base_path if path is None else path)
                if protocol and method == "put" and where != "path":
                    path["name"] = f"dom-new-{next(fresh)}"
                url = template
                for key, text in path.items():
                    url = url.replace("{" + key + "}", text if key == "path" else escaped(text))
                query = base_query if query is None else query
                if query:
                    url += "?" + "&".join(f"{k}={escaped(v)}" for k, v in query.items())
                out_of_range = isinstance(value, int) and value in OUT_OF_RANGE
                return Probe(method.upper(), template, where, name, value, url,
                             base_headers if headers is None else headers,
                             raw_body if content is None else content, integer and out_of_range)

            for value in PROBES:
                text = str(value)
                for p in params:
                    declared = is_integer(doc, p.get("schema", {}))
                    if p["in"] == "path":
                        # a stream path keeps its own slashes
                        given = "/dom/" + escaped(text) if p["name"] == "path" else text
                        table.append(probe("path", p["name"], value, path={**base_path, p["name"]: given},
                                           integer=declared))
                    elif p["in"] == "query":
                        table.append(probe("query", p["name"], value, query={**base_query, p["name"]: text},
                                           integer=declared))
                    elif p["in"] == "header":
                        table.append(probe("header", p["name"], value, headers={**base_headers, p["name"]: text},
                                           integer=declared))
                if isinstance(body, dict) and media_type == "application/json":
                    for name, changed in body_variants(body, fields, value):
                        table.append(probe("body", name, value, content=dumps(changed), integer=name in integers))
    return table


# --- sending ------------------------------------------------------------------------------


def send(server: Server, client: httpx.Client, probe: Probe) -> tuple[int, str]:
    """(status, answer excerpt); status 0: no HTTP answer (the connection dropped).
    Each on a connection of its own (Connection: close): the server closes
    the connection of a 500, which would fail the next request on it."""
    headers = {"Authorization": f"Bearer {server.token}", "Connection": "close", **probe.headers}
    if not all(v.isascii() and v.isprintable() for v in headers.values()):
        return send_raw(server, probe, headers)
    try:
        with client.stream(probe.method, server.url + probe.url, headers=headers, content=probe.body) as response:
            if response.status_code < 300:
                return response.status_code, ""  # an SSE answer would never end: not read
            return response.status_code, response.read().decode(errors="replace")[:300]
    except httpx.TransportError as exc:
        return 0, repr(exc)


def send_raw(server: Server, probe: Probe, headers: dict[str, str]) -> tuple[int, str]:
    """The request as bytes over a socket: httpx refuses to send such a header."""
    split = urlsplit(server.url)
    body = probe.body or b""
    head = [f"{probe.method} {probe.url} HTTP/1.1", f"Host: {split.netloc}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((split.hostname, split.port), timeout=30) as s:
        s.sendall("\r\n".join(head).encode("utf-8", "surrogatepass") + b"\r\n\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                return 0, "closed without an answer"
            answer += chunk
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    return int(status_line.split()[1]), status_line


def wrong(probe: Probe, status: int, answer: str) -> bool:
    if status == 504 and probe.template.endswith("/-/subscription/wait") and "not_processed" in answer:
        return False  # the documented answer of a wait that ran out (timeout_s=0)
    return status == 0 or status >= 500 or (probe.integer and not 400 <= status < 500)


def test_every_parameter_refuses_values_outside_the_domain(served: Server) -> None:
    with served.client() as http:
        path_base = set_up(http)
        doc = http.get("/openapi.json").json()
    table = probes(doc, path_base)
    assert len(table) > 2000  # the document was walked

    def run(probe: Probe) -> str | None:
        status, answer = send(served, client, probe)
        return f"{status} {probe.label()}: {answer}" if wrong(probe, status, answer) else None

    first = [p for p in table if p.method != "DELETE"]
    last = [p for p in table if p.method == "DELETE"]
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(8) as pool:
        offenders = [o for o in pool.map(run, first) if o]
        offenders += [o for o in pool.map(run, last) if o]
    assert not offenders, f"{len(offenders)} of {len(table)} probes:\n" + "\n".join(offenders)


def test_every_integer_parameter_and_body_field_declares_its_range() -> None:
    """What the walk cannot see: every integer a route declares (a
    parameter, a body field at any depth) says its range, inside signed 64
    bits, so the document tells clients the domain (and Schemathesis tests
    its edges)."""
    doc = create_app(lambda: None).openapi()
    unbounded = []
    for template, operations in doc["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {template}"
            for p in operation.get("parameters", []):
                unbounded += [f"{where} {p['in']} {p['name']}" for at, schema in integers(doc, p.get("schema", {}), "")
                              if not bounded(schema)]
            for media_type, spec in operation.get("requestBody", {}).get("content", {}).items():
                unbounded += [f"{where} body{at}" for at, schema in integers(doc, spec.get("schema", {}), "")
                              if not bounded(schema)]
    assert not unbounded, "\n".join(unbounded)


def integers(doc: dict[str, Any], schema: dict[str, Any], at: str, seen: frozenset[str] = frozenset()
             ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, schema) of every integer a schema holds, at any depth."""
    if "$ref" in schema:
        if schema["$ref"] in seen:  # a recursive schema (JSON values): walked once
            return
        seen = seen | {schema["$ref"]}
    schema = resolve(doc, schema)
    if schema.get("type") == "integer":
        yield at, schema
    for option in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        yield from integers(doc, option, at, seen)
    for name, inner in schema.get("properties", {}).items():
        yield from integers(doc, inner, f"{at}.{name}", seen)
    if isinstance(schema.get("items"), dict):
        yield from integers(doc, schema["items"], f"{at}[]", seen)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from integers(doc, schema["additionalProperties"], f"{at}.*", seen)


def bounded(schema: dict[str, Any]) -> bool:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    return low is not None and high is not None and MIN_INT <= low and high <= MAX_INT + 1
