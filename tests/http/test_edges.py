"""The edges of the HTTP API, on both backends: NUL characters, error shapes
and codes, Content-Type, missing streams, PUT definitions, tails of closed
streams (see docs/http.md)."""

from __future__ import annotations

import pytest

from .conftest import events_url


def error_of(response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert response.headers["content-type"] == "application/json"
    return response.status_code, body["error"]["code"]


# --- NUL characters ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("GET", "/v1/streams?prefix=/a%00", "prefix"),
        ("GET", "/v1/streams?after=/a%00", "after"),
        ("GET", "/v1/streams?tenant=a%00", "tenant"),
        ("GET", "/v1/streams?limit=1&a%00=1", "a\\0"),
        ("GET", "/v1/streams/a%00b", "path"),
        ("PUT", "/v1/streams/a%00b", "path"),
        ("GET", "/v1/streams/a%00b/-/events", "path"),
        ("POST", "/v1/streams/a%00b/-/events", "path"),
        ("GET", "/v1/streams/nul/-/events?after=%00", "after"),
        ("GET", "/v1/streams/nul/-/tail?types=a%00", "types"),
        ("GET", "/v1/streams/nul/-/tail?where=%00", "where"),
        ("GET", "/v1/streams/nul/-/consumers?tenant=%00", "tenant"),
        ("POST", "/v1/streams/nul/-/consumers/c%00/ack", "path"),
        ("DELETE", "/v1/streams/nul/-/consumers/c%00", "path"),
        ("GET", "/v1/streams/nul/-/subscription?name=s%00", "name"),
        ("DELETE", "/v1/streams/nul/-/subscription?name=s%00", "name"),
        ("GET", "/v1/streams/nul/-/objects/o%00", "path"),
        ("DELETE", "/v1/tokens/t%00", "path"),
        ("GET", "/v1/instances?actor=a%00", "actor"),
        ("GET", "/v1/instances?after=%00", "after"),
        ("GET", "/v1/instances/i%00", "path"),
        ("GET", "/v1/instances/i/queue?status=%00", "status"),
        ("GET", "/api/workflow-streams/runs/r%00/streams/s", "path"),
        ("GET", "/api/workflow-streams/runs/r/streams/s/records?after=0%00", "after"),
        ("POST", "/api/workflow-streams/runs/r/streams/s/consumers/c%00/ack", "path"),
        ("GET", "/v1/portals/p%00", "path"),
    ],
)
def test_a_nul_anywhere_in_the_url_is_invalid_input(http, method, url, field):
    r = http.request(method, url, json={"type": "x", "offset": 0} if method in ("POST", "PUT") else None)
    assert error_of(r) == (400, "invalid_input")
    assert r.json()["error"]["field"] == field
