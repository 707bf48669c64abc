"""Property-based fuzzing of the live HTTP API with Schemathesis.

Schemathesis reads the running server's ``/openapi.json`` (the ``server``
fixture: a real ``yoke serve`` per backend), generates requests for every
operation -- its coverage phase (boundary and type-violating values of each
parameter, undeclared methods, missing auth) and its fuzzing phase
(Hypothesis, positive and negative data) -- and sends them with the server's
admin token. The property: **no generated input makes the server answer
5xx**. A 5xx failure carries the server's log since the request (the
traceback) next to Schemathesis' ``curl`` reproduction.

The served spec documents every request body (yoke/http/schemas.py,
checked by test_openapi.py), so Schemathesis generates bodies from it as it
is. What this test adds, all on the test side:

* Steering. The server 403s any ``?tenant=`` other than the token's before
  doing anything, and a stream path must start with ``/`` and use
  ``A-Z a-z 0-9 . _ ~ : @ -`` -- constraints the spec does not state, so
  unsteered almost every request stops at the auth or path check. Each
  generated tenant, stream path, run/stream id and ``Idempotency-Key`` is
  replaced by a valid one most of the time (hooks on this schema only;
  bodies untouched).
* Hostile strings: a share of generated top-level string parameters and
  fields are replaced by values that break stores and routers (NUL, which
  PostgreSQL text/jsonb refuse; ``..``, ``-``, long strings; integers past
  signed 64 bits as text, for the parameters that carry numbers as strings,
  such as the Durable Streams headers and offsets; a failure id whose
  coordinates decode to a path with NUL), which random text rarely hits in
  a few examples. Schemathesis itself never puts NUL in a path parameter,
  so those are not covered here (test_input_domains.py covers them).
* Out-of-range integers: every integer parameter and body field declares
  its range (test_input_domains.py checks it), so the coverage phase sends
  the values just past it (2^63 for a time or an offset).

* Subscriptions are real (the server delivers them): a generated webhook
  URL is replaced by a local port nothing listens on, so no request leaves
  the machine, and a generated ``timeout_s`` of the wait route is capped at
  0.5 s, so a wait that cannot finish does not hold the run for a minute.

SSE operations (``/-/tail``, ``/-/connection``, ``/subscribe``) stream forever and are excluded.
The Durable Streams routes (``/v1/stream/{name}``) are checked for server
errors only: their answers carry the stream's Content-Type over an empty
body (PUT, HEAD), which the JSON checks take for malformed JSON (the
protocol's conformance suite, tests/durable_streams, checks the answers);
their ``live=sse`` reads stream forever, so the steering leaves ``live``
out then, and the server's long-polls last ``MAX_WAIT_S``.
Bounded and reproducible: ``MAX_EXAMPLES`` fuzzing examples per operation,
derandomized with a fixed seed, no example database written to the repo.

One test file per backend (test_schemathesis_sqlite.py and _postgres.py
import this module), so that ``make test``'s workers, which take a file
each, fuzz the two servers at the same time: the run is the suite's
longest.

    .venv/bin/python -m pytest -q tests/http/test_schemathesis_*.py
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.meta import CoveragePhaseData
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from .conftest import Server, start_server, stop_server

MAX_EXAMPLES = 20
SEED = 20_260_101
SSE_OPERATIONS = r"/-/tail$|/-/connection$|/subscribe$"
PROTOCOL_OPERATIONS = r"^/v1/stream/"
HOSTILE_STRINGS = [
    "\x00", "a\x00b", "%00", "..", "-", "a/-/b", "\u2028", "x" * 600,
    str(2**63), str(2**64), str(-(2**63) - 1),  # integers outside what the stores hold, as text
    "ht_WyIvYVx1MDAwMGIiLCJzIiwxXQ",  # a failure id naming the path "/a\u0000b"
]
HOSTILE_PROBABILITY = 0.3

# Beyond "no 5xx", only checks that hold for legitimate reasons on this API:
# each response's Content-Type is one the spec declares, and each response
# whose status the spec documents matches that answer's schema (every 2xx
# answer and the {"error": ...} body are described: yoke/http/schemas.py).
# Left out because they fail on what the spec omits rather than on server
# faults: status_code_conformance (not every route lists every error status
# it can give, e.g. 415 or 408), positive_data_acceptance (path, tenant and
# id parameters carry no pattern, so "valid" values are often refused),
# negative_data_rejection, and unsupported_method (``PUT {path:path}`` also
# matches ``/x/-/close`` etc., so some undeclared methods answer 400 rather
# than 405).
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
PROTOCOL_CHECKS = [not_a_server_error]

# --- steering ----------------------------------------------------------------------

TENANT = "default"  # the tenant of the server's admin token
NOT_IN_SEGMENT = re.compile(r"[^A-Za-z0-9._~:@\-]+")  # yoke.events.PATH_SEGMENT_RE
STREAM_PATH_PARAMS = {"path"}
SEGMENT_PARAMS = {"runID", "streamID", "name"}  # name: a Durable Streams stream's (or a portal's)


def valid_segment(value: Any) -> str:
    cleaned = NOT_IN_SEGMENT.sub("", str(value))[:100]
    return cleaned if cleaned not in ("", ".", "..", "-") else "s"


def valid_stream_path(value: Any) -> str:
    return "/fuzz/" + "/".join([valid_segment(s) for s in str(value).split("/") if s][:4] or ["s"])


def valid_path_parameters(params: dict[str, Any], keep: str | None = None) -> dict[str, Any]:
    fixed = dict(params)
    for name in STREAM_PATH_PARAMS & fixed.keys() - {keep}:
        fixed[name] = valid_stream_path(fixed[name])
    for name in SEGMENT_PARAMS & fixed.keys() - {keep}:
        fixed[name] = valid_segment(fixed[name])
    return fixed


def install_steering(schema: schemathesis.BaseSchema) -> None:
    """Hooks of this schema: offer valid context values next to generated ones."""

    @schema.hook
    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
        if not path_parameters or not (STREAM_PATH_PARAMS | SEGMENT_PARAMS) & path_parameters.keys():
            return st.just(path_parameters)
        return st.sampled_from([valid_path_parameters(path_parameters)] * 3 + [path_parameters])

    @schema.hook
    def flatmap_query(context: Any, query: dict[str, Any] | None) -> Any:
        if not query or "tenant" not in query:
            return st.just(query)
        rest = {k: v for k, v in query.items() if k != "tenant"}
        return st.sampled_from([rest, {**rest, "tenant": TENANT}, rest, query])

    @schema.hook
    def flatmap_headers(context: Any, headers: dict[str, Any] | None) -> Any:
        if not headers or "Idempotency-Key" not in headers:
            return st.just(headers)
        return st.sampled_from([{k: v for k, v in headers.items() if k != "Idempotency-Key"}, headers])

    @schema.hook
    def map_case(context: Any, case: schemathesis.Case) -> schemathesis.Case:
        # A coverage-phase case varies one parameter and gives the others a
        # base value: make those base values ones the server accepts.
        meta = case.meta
        if meta is None or not isinstance(meta.phase.data, CoveragePhaseData):
            return case
        about = meta.phase.data.parameter
        if case.path_parameters:
            case.path_parameters = valid_path_parameters(case.path_parameters, keep=about)
        if about != "tenant" and case.query and "tenant" in case.query:
            case.query = {k: v for k, v in case.query.items() if k != "tenant"}
        if about != "Idempotency-Key" and case.headers and "Idempotency-Key" in case.headers:
            case.headers = {k: v for k, v in case.headers.items() if k != "Idempotency-Key"}
        return case


# --- subscriptions are delivered for real ---------------------------------------------

LOCAL_WEBHOOK = "http://127.0.0.1:9/fuzz"  # the discard port: refused at once
MAX_WAIT_S = 0.5


def keep_local_and_short(case: schemathesis.Case) -> None:
    """A webhook the server would POST to goes to LOCAL_WEBHOOK; waits are
    short; a Durable Streams read is never an SSE stream (it would not end);
    a hostile string no HTTP client can put in a header is left out."""
    body = case.body
    receiver = body.get("receiver") if isinstance(body, dict) else None
    if isinstance(receiver, dict) and isinstance(receiver.get("url"), str):
        if receiver["url"].lower().startswith(("http://", "https://")):
            case.body = {**body, "receiver": {**receiver, "url": LOCAL_WEBHOOK}}
    timeout = case.query.get("timeout_s") if case.query else None
    if timeout is not None and not isinstance(timeout, bool) and seconds(timeout) > MAX_WAIT_S:
        case.query = {**case.query, "timeout_s": MAX_WAIT_S}
    if case.query and str(case.query.get("live", "")).lower() == "sse":
        case.query = {k: v for k, v in case.query.items() if k != "live"}
    if case.headers:
        case.headers = {k: v for k, v in case.headers.items() if sendable(v)}


def sendable(value: Any) -> bool:
    """A header value requests sends (it refuses leading whitespace, such as
    U+2028, line breaks and what Latin-1 cannot encode, before sending)."""
    text = str(value)
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return text == "" or (not text[0].isspace() and "\r" not in text and "\n" not in text)


def seconds(value: Any) -> float:
    """A generated timeout as a number (examples come as strings too: "20.0")."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0  # not a number: the server refuses it at once


# --- the test ----------------------------------------------------------------------


def fuzzed_server(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The ``server`` fixture of a test module (one per backend): conftest's
    server, with short Durable Streams long-polls (a generated
    ``live=long-poll`` at a stream's tail would hold the run for 20 s)."""
    base = tmp_path_factory.mktemp("server")
    db_url = f"sqlite:///{base}/yoke.db" if backend == "sqlite" else request.getfixturevalue("pg_url")
    srv = start_server(db_url, base / ".yoke", YOKE_PROTOCOL_LONG_POLL_S=str(MAX_WAIT_S))
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def api_schema(server: Server) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "dictionaries": {"hostile": {"values": HOSTILE_STRINGS}},
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,  # Hypothesis derandomize
                "database": "none",  # no example database written under .hypothesis/
                "dictionaries": {"string": {"dictionary": "hostile", "probability": HOSTILE_PROBABILITY}},
            },
        }
    )
    response = httpx.get(server.url + "/openapi.json", timeout=30)
    response.raise_for_status()
    schema = schemathesis.openapi.from_dict(response.json(), config=config)
    schema.config.update(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, request_timeout=30
    )
    install_steering(schema)
    return schema


@pytest.fixture(autouse=True)
def _pytest9_node_id(request: pytest.FixtureRequest) -> Iterator[None]:
    # schemathesis 4.32's lazy loader renames the running test through
    # ``node._nodeid``, which pytest 9.2 no longer has (it keeps ``_id``).
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    yield


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=SSE_OPERATIONS)


@schema.parametrize()
def test_no_server_errors(case: schemathesis.Case, server: Server) -> None:
    log = server_log(server)
    start = log.stat().st_size
    keep_local_and_short(case)
    response = case.call()
    if is_wait_timeout(case, response):
        return  # the documented answer of a wait that did not see its offset processed in time
    checks = PROTOCOL_CHECKS if re.match(PROTOCOL_OPERATIONS, case.path) else CHECKS
    try:
        case.validate_response(response, checks=checks)
    except BaseException as exc:
        if response.status_code >= 500:
            exc.add_note("server log since the request:\n" + log_since(log, start))
        raise


def is_wait_timeout(case: schemathesis.Case, response: Any) -> bool:
    """504 ``not_processed`` from ``.../-/subscription/wait``: the wait ran
    out (now reachable: the spec's examples configure a real subscription)."""
    if response.status_code != 504 or not case.path.endswith("/-/subscription/wait"):
        return False
    return response.json().get("error", {}).get("code") == "not_processed"


def server_log(server: Server) -> Path:
    """Where tests/http/conftest.py start_server writes the server's output."""
    return server.data_dir.parent / f"server-{urlsplit(server.url).port}.log"


def log_since(log: Path, start: int) -> str:
    """The server's output after byte ``start`` (uvicorn logs a 500's
    traceback just after sending the response, so wait briefly for it)."""
    deadline = time.monotonic() + 2
    while log.stat().st_size == start and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    with log.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")[-8000:]
