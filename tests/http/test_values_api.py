"""The value domain over HTTP: raw JSON bodies, as any client sends them.

orjson reads an integer beyond 64 bits as a float; the server must refuse
it by name, not store 1.2345678901234568e+22. Numbers come back as written.
"""

from __future__ import annotations

import json

import pytest

from .conftest import events_url

JSON = {"Content-Type": "application/json"}
FOUR_BYTES = "\U0001F600"


def post_raw(http, path: str, body: bytes):
    return http.post(events_url(path), content=body, headers=JSON)


@pytest.mark.parametrize(
    "payload, field",
    [
        (b'{"x": 12345678901234567890123}', "payload.x"),
        (b'{"x": 9223372036854775808}', "payload.x"),
        (b'{"x": -9223372036854775809}', "payload.x"),
        (b'{"x": 18446744073709551616}', "payload.x"),
        (b'{"x": [1, 1e400]}', "payload.x[1]"),
        (b'{"x": -1e999}', "payload.x"),
    ],
)
def test_numbers_outside_the_domain_are_refused_by_name(http, path, payload, field):
    body = b'[{"type": "ok"}, {"type": "bad", "payload": ' + payload + b"}]"
    r = post_raw(http, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_event", field)
    assert http.get(f"/v1/streams{path}").status_code == 404  # nothing appended


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_constants_are_invalid_json(http, path, literal):
    r = post_raw(http, path, b'{"type": "t", "payload": {"x": ' + literal + b"}}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input"


def test_numbers_come_back_as_written(http, path):
    body = (
        b'{"type": "n", "payload": {"max": 9223372036854775807, "min": -9223372036854775808,'
        b' "f": 1e18, "h": 100.0, "z": -0.0, "tiny": 5e-324, "digits": "12345678901234567890123"}}'
    )
    r = post_raw(http, path, body)
    assert r.status_code == 201, r.text
    raw = http.get(f"{events_url(path)}/1").content
    payload = json.loads(raw)["payload"]  # the standard library: exact integers
    assert payload == {
        "max": 2**63 - 1, "min": -(2**63), "f": 1e18, "h": 100.0, "z": -0.0, "tiny": 5e-324,
        "digits": "12345678901234567890123",
    }
    assert [type(payload[k]) for k in ("max", "f", "h", "z")] == [int, float, float, float]
    assert b'"z":-0.0' in raw


def test_the_size_cap_counts_utf8_bytes(http, path):
    # 65,000 characters but 260,000 bytes: too large.
    r = http.post(events_url(path), json={"type": "t", "payload": FOUR_BYTES * 65_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "event_too_large"
    assert r.json()["error"]["size"] > 260_000
    # Exactly the limit: type 't' (1) + {"s":"..."} (8 + 4n) + {} (2) + 64 = 65,536.
    room = 65_536 - 64 - 1 - 2 - 8
    r = http.post(events_url(path), json={"type": "t", "payload": {"s": FOUR_BYTES * (room // 4) + "x" * (room % 4)}})
    assert r.status_code == 201, r.text
    info = http.get(f"/v1/streams{path}").json()
    assert info["usage"]["durable_bytes"] == 65_536


def appended_bytes(http) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('yoke_stream_appended_bytes_total{tenant="default"}'):
            return float(line.split()[-1])
    return 0.0


def test_the_appended_bytes_metric_counts_utf8_bytes(http, path):
    before = appended_bytes(http)
    # type 't' (1) + {"s":"😀😀"} (8 + 8) + {} (2) + 64 = 83 bytes, in 11 characters of payload.
    r = http.post(events_url(path), json={"type": "t", "payload": {"s": FOUR_BYTES * 2}})
    assert r.status_code == 201
    assert appended_bytes(http) - before == 83


def test_a_refusal_that_echoes_a_huge_integer_is_still_the_refusal(http, path):
    """ObjectTooLarge echoes the size asked for: an integer beyond 64 bits
    made the JSON error body itself fail, and the answer was a 500."""
    body = b'{"idempotency_key": "k", "sha256": "' + b"0" * 64 + b'", "size": 99999999999999999999999}'
    r = http.post(f"/v1/streams{path}/-/objects", content=body, headers=JSON)
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == "object_too_large" and error["size"] == "99999999999999999999999"


def test_nanosecond_timestamps_take_the_fast_parser_and_read_back_exactly(http, path):
    r = post_raw(http, path, b'{"type": "t", "payload": {"ns": 1733011200123456789, "neg": -8999999999999999999}}')
    assert r.status_code == 201, r.text
    payload = json.loads(http.get(f"{events_url(path)}/1").content)["payload"]
    assert payload == {"ns": 1733011200123456789, "neg": -8999999999999999999}
