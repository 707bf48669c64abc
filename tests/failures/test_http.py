"""The failures inbox over HTTP against a real ``yoke serve --app`` on both
backends: a poisoned event dead-letters in an actor, halts a copy whose
transform fails and is skipped by a call receiver; ``/v1/failures`` lists,
shows, replays (as is and corrected), discards, and does both by filter;
scopes and errors."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import httpx
import orjson

from .app import POISON_COPY
from .conftest import Served

DEADLINE_S = 20


def wait_for(fetch: Any, done: Any) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"condition not met; last value: {value}"
        time.sleep(0.05)


def failures(http: httpx.Client, **params: Any) -> list[dict]:
    r = http.get("/v1/failures", params=params)
    assert r.status_code == 200, r.text
    return r.json()["failures"]


def events(http: httpx.Client, path: str) -> list[dict]:
    r = http.get(f"/v1/streams{path}/-/events", params={"after": 0, "limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["events"]


def setup_poison(http: httpx.Client) -> dict[str, Any]:
    """An actor instance, a copy /s -> /t whose transform fails on poison, a
    call receiver that skips; then one poisoned and one good event on /s."""
    inst = http.post("/v1/instances", json={"actor": "orders", "key": "k"}).json()
    for body in (
        {"name": "archive", "receiver": {"kind": "copy", "target": "/t"}, "filter": {"types": ["order"]},
         "transform": POISON_COPY, "start": "beginning"},
        {"name": "rec", "receiver": {"kind": "call", "function": "rec"}, "filter": {"types": ["order"]},
         "start": "beginning", "on_failing_event": "skip"},
    ):
        r = http.post("/v1/streams/s/-/subscriptions", json=body)
        assert r.status_code == 201, r.text
    sent = http.post("/v1/streams/s/-/events", json=[
        {"type": "order", "payload": {"n": 1, "poison": True}}, {"type": "order", "payload": {"n": 2}},
    ]).json()["results"]
    listed = wait_for(lambda: failures(http), lambda fs: len(fs) == 3)
    return {"instance": inst, "sent": sent, "by_kind": {f["kind"]: f for f in listed}}


def received(served: Served) -> list[dict]:
    if not served.received.exists():
        return []
    return [orjson.loads(line) for line in served.received.read_bytes().splitlines()]


def test_list_show_replay_corrected_and_discard(served: Served, admin: httpx.Client, tenant: str) -> None:
    got = setup_poison(admin)
    dead, halted, skipped = (got["by_kind"][k] for k in ("dead_letter", "halted", "skipped"))
    poisoned = got["sent"][0]
    assert (dead["receiver"], dead["actor"], dead["path"]) == ("actor", "orders", "/s")
    assert dead["offset"] == poisoned["offset"]
    assert (halted["receiver"], halted["subscription"]) == ("copy", "archive")
    assert (skipped["receiver"], skipped["subscription"], skipped["attempt_count"]) == ("call", "rec", 3)
    assert halted["error"].startswith("InvalidTransform") and dead["error"] == "ValueError: poisoned order 1"
    assert [a["number"] for a in dead["attempts"]] == [1, 2] and len(halted["attempts"]) == 15
    assert [a["number"] for a in skipped["attempts"]] == [1, 2, 3]
    for f in (dead, halted, skipped):
        shown = admin.get(f"/v1/failures/{f['id']}")
        assert shown.status_code == 200 and shown.json() == f
        assert f["event"]["id"] == poisoned["id"] and f["attempts"][-1]["error"] == f["error"]
    # The metrics count them (sampled from the database in the background).
    counted = [f'yoke_failures{{age="under_1m",kind="{kind}",receiver="{receiver}",tenant="{tenant}"}} 1.0'
               for kind, receiver in (("dead_letter", "actor"), ("halted", "copy"), ("skipped", "call"))]
    scraped = wait_for(lambda: admin.get("/metrics").text, lambda text: all(c in text for c in counted))
    for kind in ("dead_letter", "halted", "skipped"):
        assert f'yoke_failure_oldest_age_seconds{{kind="{kind}",tenant="{tenant}"}}' in scraped
    # Filters.
    assert [f["id"] for f in failures(admin, kind="halted")] == [halted["id"]]
    assert [f["id"] for f in failures(admin, receiver="call")] == [skipped["id"]]
    assert [f["id"] for f in failures(admin, actor="orders")] == [dead["id"]]
    assert [f["id"] for f in failures(admin, subscription="archive", stream="/s")] == [halted["id"]]
    assert failures(admin, stream="/other") == [] and failures(admin, since=int(time.time() * 1000) + 60_000) == []
    assert len(failures(admin, limit=1)) == 1

    # The actor's dead letter, corrected: processed once, with its provenance.
    fix = {"event": {"payload": {"n": 1}}}
    r = admin.post(f"/v1/failures/{dead['id']}/replay", json=fix)
    assert r.status_code == 200, r.text
    assert r.json()["action"] == "replayed" and r.json()["audit_path"] == "/s"
    state = wait_for(lambda: admin.get(f"/v1/instances/{got['instance']['id']}").json()["state"]["value"],
                     lambda s: sorted(s.get("seen", [])) == [1, 2])
    assert state["seen"].count(1) == 1
    # The copy's halt, patched (the poison member removed, the rest kept):
    # the corrected event copied once, then the rest.
    r = admin.post(f"/v1/failures/{halted['id']}/replay", json={"patch": {"payload": {"poison": None}}})
    assert r.status_code == 200 and r.json()["delivered"] is True, r.text
    copied = wait_for(lambda: [e for e in events(admin, "/t") if e["type"] == "order"], lambda es: len(es) == 2)
    assert [e["payload"] for e in copied] == [{"n": 1}, {"n": 2}]
    assert copied[0]["source"]["replay_of"]["id"] == poisoned["id"]
    # The skip, as it is: still poisoned, the receiver fails it (502) and it stays open.
    r = admin.post(f"/v1/failures/{skipped['id']}/replay")
    assert r.status_code == 502 and r.json()["error"]["code"] == "replay_failed"
    r = admin.post(f"/v1/failures/{skipped['id']}/discard", json={"reason": "poison test"})
    assert r.status_code == 200 and r.json()["action"] == "discarded"
    assert failures(admin) == []
    audit = [e for e in events(admin, "/s") if e["type"].startswith("yoke.failure.")]
    assert [(e["type"], e["payload"]["failure"]) for e in audit] == [
        ("yoke.failure.replayed", dead["id"]), ("yoke.failure.replayed", halted["id"]),
        ("yoke.failure.discarded", skipped["id"]),
    ]
    assert audit[2]["payload"]["reason"] == "poison test"
    # Resolved: gone.
    r = admin.get(f"/v1/failures/{dead['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "failure_not_found"


def test_replay_and_discard_by_filter(served: Served, admin: httpx.Client) -> None:
    got = setup_poison(admin)
    skipped = got["by_kind"]["skipped"]
    r = admin.post("/v1/failures/replay", json={"filter": {"kind": "skipped"}, "event": {"payload": {"n": 1}}})
    assert r.status_code == 200, r.text
    assert [d["id"] for d in r.json()["done"]] == [skipped["id"]] and r.json()["failed"] == []
    assert any(x["replay_of"] and x["replay_of"]["failure"] == skipped["id"] for x in received(served))
    r = admin.post("/v1/failures/replay", json={"filter": {"kind": "halted"}})  # as it is: resumes, halts again
    assert r.status_code == 200 and len(r.json()["done"]) == 1
    wait_for(lambda: failures(admin, kind="halted"), lambda fs: len(fs) == 1)
    r = admin.post("/v1/failures/discard", json={"filter": {"stream": "/s"}, "reason": "test data"})
    assert r.status_code == 200 and len(r.json()["done"]) == 2, r.text
    assert failures(admin) == []


def test_scopes_and_errors(served: Served, admin: httpx.Client, tenant: str) -> None:
    got = setup_poison(admin)
    some = got["by_kind"]["dead_letter"]["id"]
    with served.server.client(served.server.new_token(tenant, "read")) as reader:
        assert reader.get("/v1/failures").status_code == 200
        assert reader.get(f"/v1/failures/{some}").status_code == 200
        for url, body in ((f"/v1/failures/{some}/replay", None), (f"/v1/failures/{some}/discard", {"reason": "x"}),
                          ("/v1/failures/replay", {"filter": {}}),
                          ("/v1/failures/discard", {"filter": {}, "reason": "x"})):
            assert reader.post(url, json=body).status_code == 403
    with served.server.client(served.server.new_token("someone-else", "admin")) as other:
        assert other.get("/v1/failures").json() == {"failures": []}
        assert other.get(f"/v1/failures/{some}").status_code == 404
    cases = [
        (admin.get("/v1/failures", params={"kind": "lost"}), 400, "invalid_input"),
        (admin.get("/v1/failures", params={"limit": 0}), 400, "invalid_input"),
        (admin.get("/v1/failures/nope"), 404, "failure_not_found"),
        (admin.post(f"/v1/failures/{some}/discard", json={}), 400, "invalid_input"),
        (admin.post(f"/v1/failures/{some}/discard", json={"reason": "x", "extra": 1}), 400, "invalid_input"),
        (admin.post(f"/v1/failures/{some}/replay", json={"event": {"offset": 1}}), 400, "invalid_input"),
        (admin.post(f"/v1/failures/{some}/replay", json={"patch": {"offset": 1}}), 400, "invalid_input"),
        (admin.post(f"/v1/failures/{some}/replay", json={"patch": {"payload": {}}, "event": {"payload": {}}}), 400,
         "invalid_input"),
        (admin.post("/v1/failures/replay", json={"filter": {}, "patch": []}), 400, "invalid_input"),
        (admin.post(f"/v1/failures/{some}/replay", json={"event": {"type": "yoke.x"}}), 400, "reserved_event_type"),
        (admin.post("/v1/failures/discard", json={"reason": "x"}), 400, "invalid_input"),
        (admin.post("/v1/failures/replay", json={"filter": {"colour": "red"}}), 400, "invalid_input"),
    ]
    for r, status, code in cases:
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert len(failures(admin)) == 3  # nothing changed


PINS = {  # a workflow stream that pins its data handling (tests/http/test_workflow_streams.py)
    "redaction": [{"path": "$.payload.user.email", "lifted_by": ["pii:read"]}],
    "authorization": {"read": {"scopes": ["run:read", "admin"]}, "append": {"scopes": ["run:write", "admin"]}},
    "content_classes": ["model_output"],
}


def test_a_pinned_streams_events_stay_out_of_the_generic_routes(served: Served, admin: httpx.Client) -> None:
    run = "run-" + uuid.uuid4().hex[:8]
    base = f"/api/workflow-streams/runs/{run}/streams"
    assert admin.post(base, json={"stream_id": "answer", **PINS}).status_code == 201
    assert admin.post("/v1/instances", json={"actor": "answers", "key": "k"}).status_code == 201
    record = {"type": "answer", "payload": {"user": {"email": "a@b.c"}, "poison": True},
              "metadata": {"content_class": "model_output"}}
    assert admin.post(f"{base}/answer/records", json=record).status_code == 201
    [f] = wait_for(lambda: failures(admin), lambda fs: len(fs) == 1)
    # The actor's own queue listings leave the event and its errors out too.
    instance = f"/v1/instances/{f['instance_id']}"
    for listing in (admin.get(f"{instance}/dlq"), admin.get(f"{instance}/queue", params={"status": "dead"})):
        assert listing.status_code == 200, listing.text
        [row] = listing.json()["rows"]
        assert (row["path"], row["event"], row["last_error"], row["last_traceback"]) == (f["path"], None, None, None)
        assert "a@b.c" not in listing.text
    # Its kept input too (the dead-lettered run's record).
    kept = admin.get(f"{instance}/inputs")
    [record] = kept.json()["inputs"]
    assert (record["path"], record["outcome"], record["event"], record["error"]) == (f["path"], "dead", None, None)
    assert "a@b.c" not in kept.text
    assert f["path"] == f"/runs/{run}/answer" and f["event"] is None  # the email stays out
    shown = admin.get(f"/v1/failures/{f['id']}").json()
    assert shown["event"] is None and shown["attempt_count"] == 1
    assert "a@b.c" not in admin.get("/v1/failures").text + str(shown)  # nor in an error text
    for r in (admin.post(f"/v1/failures/{f['id']}/replay", json={"event": {"payload": {}}}),
              admin.post(f"/v1/failures/{f['id']}/replay", json={"patch": {"payload": {"poison": None}}}),
              admin.post("/v1/failures/replay", json={"filter": {}, "event": {"payload": {}}}),
              admin.post("/v1/failures/replay", json={"filter": {}, "patch": {"payload": {}}})):
        assert (r.status_code, r.json()["error"]["code"]) == (403, "data_handling_pinned"), r.text
    assert failures(admin) != []  # nothing was replayed
    assert admin.post(f"/v1/failures/{f['id']}/discard", json={"reason": "test"}).status_code == 200
    assert failures(admin) == []


def raw_id(prefix: str, coordinates: bytes) -> str:
    """An id made by hand from its JSON coordinates (model.make_id refuses what these hold)."""
    return prefix + base64.urlsafe_b64encode(coordinates).decode().rstrip("=")


# ht_WyIvYVx1MDAwMGIiLCJzIiwxXQ: the issue's own example, ["/a\u0000b","s",1].
NOT_TEXT_IDS = [
    "ht_WyIvYVx1MDAwMGIiLCJzIiwxXQ",
    raw_id("sk_", rb'["/s","rec\u0000",1]'),
    raw_id("ht_", rb'["/s","archive\ud800",1]'),
    raw_id("dl_", rb'["\u0000"]'),
    raw_id("dl_", b"[9223372036854775808]"),
]


def test_time_bounds_beyond_64_bits_are_invalid_input_and_change_nothing(admin: httpx.Client) -> None:
    """since and until beyond signed 64 bits, in the query and in the
    bodies of both bulk actions: 400 invalid_input naming the field (both
    backends answered 500). Nothing is resolved."""
    before = setup_poison(admin)["by_kind"]
    for name in ("since", "until"):
        for value in (2**63, 10**40):
            r = admin.get("/v1/failures", params={name: str(value)})
            assert error_field(r) == (400, "invalid_input", name), r.text
            for url, extra in (("/v1/failures/replay", {}), ("/v1/failures/discard", {"reason": "x"})):
                assert error_field(admin.post(url, json={"filter": {name: value}, **extra})) == (
                    400, "invalid_input", name)
    # A corrected event outside the domain is refused before any failure is selected.
    r = admin.post("/v1/failures/replay", json={"filter": {"stream": "/nowhere"}, "event": {"payload": {"n": 2**63}}})
    assert error_field(r) == (400, "invalid_event", "payload.n"), r.text
    assert {f["kind"]: f for f in failures(admin)} == before


def test_ids_whose_coordinates_no_store_holds_name_no_failure(admin: httpx.Client) -> None:
    """An id whose coordinates no store can hold (NUL, a lone surrogate, an
    offset past 2^63-1) names no failure: 404 failure_not_found on both
    backends (PostgreSQL answered 500 for NUL), for show, replay and discard."""
    before = setup_poison(admin)["by_kind"]
    for failure_id in NOT_TEXT_IDS:
        for r in (admin.get(f"/v1/failures/{failure_id}"), admin.post(f"/v1/failures/{failure_id}/replay"),
                  admin.post(f"/v1/failures/{failure_id}/discard", json={"reason": "x"})):
            assert (r.status_code, r.json()["error"]["code"]) == (404, "failure_not_found"), (failure_id, r.text)
    assert {f["kind"]: f for f in failures(admin)} == before


def error_field(r: httpx.Response) -> tuple[int, str, str | None]:
    error = r.json()["error"]
    return r.status_code, error["code"], error.get("field")
