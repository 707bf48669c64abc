"""Hostile input to the protocol routes (which the Schemathesis fuzzing does
not reach): each gets a 4xx with a code, never a 500 or a broken answer, and
the tenant's global stream stays Yoke's own. Both backends."""

from __future__ import annotations

import uuid

import httpx
import orjson
import pytest

from tests.http.conftest import Server

JSON = {"Content-Type": "application/json"}
LONG_DIGITS = "9" * 4301  # past int()'s 4,300-digit limit
FULL_WIDTH_FIVE = "\uff10" * 15 + "\uff15"  # "０…５": digits to \d and int(), not to the protocol


def new_stream(server: Server) -> str:
    url = f"{server.url}/v1/stream/hostile-{uuid.uuid4().hex[:8]}"
    assert httpx.put(url, headers=JSON, content=b'[{"n":1}]').status_code == 201
    return url


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error.get("field")


@pytest.mark.parametrize("cursor", ["\u00b2", "\uff17", LONG_DIGITS, "-1", "1e5"])
def test_a_strange_cursor_is_answered_with_the_current_one(dev_server: Server, cursor: str) -> None:
    url = new_stream(dev_server)
    r = httpx.get(url, params={"offset": "-1", "live": "long-poll", "cursor": cursor})
    assert r.status_code == 200, r.text
    assert r.json() == [{"n": 1}]
    assert r.headers["stream-cursor"].isascii() and int(r.headers["stream-cursor"]) > 0


def test_a_strange_cursor_on_sse_still_gets_its_control_event(dev_server: Server) -> None:
    url = new_stream(dev_server)
    params = {"offset": "-1", "live": "sse", "cursor": "\u00b2"}
    with httpx.stream("GET", url, params=params, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:
            if line == "event: control":
                control = orjson.loads(next(lines).removeprefix("data:"))
                break
    assert control["streamNextOffset"] and int(control["streamCursor"]) > 0


@pytest.mark.parametrize("offset", [FULL_WIDTH_FIVE + "_" + "0" * 16, "0" * 15 + "\u0665_" + "0" * 16])
def test_an_offset_in_other_digits_is_refused(dev_server: Server, offset: str) -> None:
    url = new_stream(dev_server)
    assert error_of(httpx.get(url, params={"offset": offset}))[:2] == (400, "invalid_cursor")


@pytest.mark.parametrize("header", ["Stream-TTL", "Producer-Epoch"])
def test_a_number_of_thousands_of_digits_is_refused(dev_server: Server, header: str) -> None:
    url = f"{dev_server.url}/v1/stream/hostile-{uuid.uuid4().hex[:8]}"
    headers = {**JSON, header: LONG_DIGITS}
    if header == "Producer-Epoch":
        url = new_stream(dev_server)
        headers.update({"Producer-Id": "p", "Producer-Seq": "0"})
        r = httpx.post(url, headers=headers, content=b'{"n":2}')
    else:
        r = httpx.put(url, headers=headers)
    assert error_of(r) == (400, "invalid_input", header)


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE"])
def test_the_global_stream_is_not_a_protocol_stream(dev_server: Server, method: str) -> None:
    """/v1/stream/ names no stream: the tenant's global stream / holds
    Yoke's own facts, and a protocol append or close must not reach it."""
    headers = {**JSON, "Stream-Closed": "true"}
    r = httpx.request(method, f"{dev_server.url}/v1/stream/", headers=headers, content=b'{"forged":1}')
    assert r.status_code == 400
    if method != "HEAD":
        assert r.json()["error"]["code"] == "invalid_path"
    with dev_server.client() as client:
        events = client.get("/v1/streams/-/events", params={"after": 0}).json()
    assert all(e["type"].startswith("yoke.") for e in events["events"])


@pytest.mark.parametrize(
    "headers, field",
    [
        ({"Stream-Forked-From": ""}, "Stream-Forked-From"),
        ({"Stream-Forked-From": "/v1/stream/"}, "Stream-Forked-From"),
        ({"Stream-Fork-Offset": "0000000000000000_0000000000000000"}, "Stream-Fork-Offset"),
        ({"Content-Type": "application/" + "x" * 300}, "Content-Type"),
    ],
)
def test_a_create_with_a_bad_header_is_refused(dev_server: Server, headers: dict[str, str], field: str) -> None:
    url = f"{dev_server.url}/v1/stream/hostile-{uuid.uuid4().hex[:8]}"
    assert error_of(httpx.put(url, headers={**JSON, **headers})) == (400, "invalid_input", field)
    assert httpx.head(url).status_code == 404  # nothing was created
