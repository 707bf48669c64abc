"""The OpenAPI document: every body and every success answer is described,
with an example that its own schema accepts.

The document is the one ``/openapi.json`` serves, made in process (it does
not depend on the backend or a runtime). A new
route that reads a body without documenting it fails here: every POST, PUT
and PATCH is taken to have a body unless it is listed in ``BODILESS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from yoke.http.app import create_app
from yoke.http.fast_append import APPEND_ROUTE

WRITES = {"post", "put", "patch"}
# Operations that take no body (a body sent to them is ignored).
BODILESS = {
    ("post", "/v1/streams{path}/-/close"),
    ("post", "/v1/streams{path}/-/objects/{object_id}/abort"),
    ("post", "/v1/streams{path}/-/subscription/resume"),
    ("post", "/v1/streams{path}/-/subscription/pause"),
    ("post", "/v1/streams{path}/-/subscription/halt"),
    ("post", "/api/workflow-streams/runs/{runID}/streams/{streamID}/close"),
    ("post", "/api/workflow-streams/runs/{runID}/streams/{streamID}/objects/{objectID}/abort"),
}
SSE = {
    ("get", "/v1/streams{path}/-/tail"),
    ("get", "/v1/streams{path}/-/connection"),
    ("get", "/api/workflow-streams/runs/{runID}/streams/{streamID}/subscribe"),
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(lambda: None)  # the runtime is opened by the lifespan, which never runs here
    return orjson.loads(orjson.dumps(app.openapi()))  # as JSON: what /openapi.json sends


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def examples_of(media: dict[str, Any]) -> list[Any]:
    found = [media["example"]] if "example" in media else []
    found += [e["value"] for e in media.get("examples", {}).values()]
    return found


def check_media(document: dict[str, Any], where: str, content: dict[str, Any]) -> list[str]:
    """What is wrong with one body's or answer's content: no schema, no
    example, or an example its schema refuses."""
    problems = []
    if not content:
        return [f"{where}: no content"]
    for media_type, media in content.items():
        schema = media.get("schema")
        if not schema:
            problems.append(f"{where} {media_type}: no schema")
            continue
        examples = examples_of(media)
        if not examples:
            problems.append(f"{where} {media_type}: no example")
        validator = Draft202012Validator({**schema, "components": document["components"]})
        for example in examples:
            for error in validator.iter_errors(example):
                at = list(error.absolute_path)
                problems.append(f"{where} {media_type}: example refused at {at}: {error.message}")
    return problems


def test_every_body_has_a_schema_and_an_example(document: dict[str, Any]) -> None:
    problems = []
    for method, path, operation in operations(document):
        where = f"{method.upper()} {path}"
        body = operation.get("requestBody")
        if method not in WRITES or (method, path) in BODILESS:
            if body is not None:
                problems.append(f"{where}: documents a body it does not take")
            continue
        if body is None:
            problems.append(f"{where}: takes a body (list it in BODILESS if not) but documents none")
            continue
        problems += check_media(document, f"{where} body", body.get("content", {}))
    assert not problems, "\n".join(problems)


def test_every_success_answer_has_a_schema_and_an_example(document: dict[str, Any]) -> None:
    problems = []
    for method, path, operation in operations(document):
        successes = {s: a for s, a in operation["responses"].items() if s.startswith("2")}
        if not successes:
            problems.append(f"{method.upper()} {path}: no success answer")
        for status, answer in successes.items():
            where = f"{method.upper()} {path} {status}"
            if status == "204":
                if answer.get("content"):
                    problems.append(f"{where}: a 204 with content")
                continue
            content = answer.get("content", {})
            if (method, path) in SSE and "text/event-stream" not in content:
                problems.append(f"{where}: a tail that does not document text/event-stream")
            problems += check_media(document, where, content)
    assert not problems, "\n".join(problems)


def test_components_are_complete(document: dict[str, Any]) -> None:
    """Every reference resolves (the request models are added by hand)."""
    text = repr(document)
    for name in set(re.findall(r"#/components/schemas/([A-Za-z0-9_.-]+)", text)):
        assert name in document["components"]["schemas"], name


def test_examples_keep_their_nulls(document: dict[str, Any]) -> None:
    """FastAPI drops null values from the document; ``schemas.complete``
    puts the examples' back (a documented null field is not a missing one)."""
    created = document["paths"]["/v1/streams{path}/-/subscriptions"]["post"]["responses"]["201"]
    assert created["content"]["application/json"]["example"]["secret"] is None
    assert document["components"]["schemas"]["StreamInfo"]["examples"][0]["usage"]["min_ack"] is None


def test_the_append_hot_path_is_documented(document: dict[str, Any]) -> None:
    """POST .../-/events is answered outside FastAPI (yoke/http/fast_append.py);
    the document still describes it, body and answer."""
    append = document["paths"]["/v1/streams{path}/-/events"]["post"]
    assert APPEND_ROUTE.match("/v1/streams/orders/-/events")
    assert append["requestBody"]["required"] is True
    assert {"one event", "a batch"} <= set(append["requestBody"]["content"]["application/json"]["examples"])
    assert append["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AppendAnswer"
    }
    headers = {p["name"] for p in append["parameters"] if p["in"] == "header"}
    assert "Idempotency-Key" in headers


def test_no_framework_validation_answer_is_documented(document: dict[str, Any]) -> None:
    """Yoke answers a bad parameter 400 invalid_input, never FastAPI's 422."""
    for method, path, operation in operations(document):
        answer = operation["responses"].get("422", {})
        assert "HTTPValidationError" not in repr(answer), f"{method.upper()} {path}"
