"""The workflow streams surface (/api/workflow-streams) in its own words
(cursor and sequence: every read returns records with sequence > cursor)
and the data handling a definition pins, on both backends."""

from __future__ import annotations

import uuid

import orjson
from httpx_sse import connect_sse


def code(r):
    return r.status_code, r.json()["error"]["code"]


def new_run() -> str:
    return "run-" + uuid.uuid4().hex[:8]


def test_cursor_and_sequence_are_the_surfaces_words(server, http):
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "out"}).status_code == 201
    http.post(f"{base}/out/records", json=[{"type": "chunk", "payload": i} for i in range(5)]).raise_for_status()
    records = f"{base}/out/records"
    assert [e["offset"] for e in http.get(records, params={"cursor": 3}).json()["events"]] == [4, 5]
    assert [e["offset"] for e in http.get(records, params={"cursor": 3, "after": 3}).json()["events"]] == [4, 5]
    r = http.get(records, params={"cursor": 3, "after": 2})
    assert code(r) == (400, "invalid_input") and "cursor" in r.json()["error"]["message"]
    # Words the route does not take are refused, naming the one meant.
    r = http.get(records, params={"sequence": 3})
    assert code(r) == (400, "invalid_input")
    assert r.json()["error"]["hint"] == "cursor" and r.json()["error"]["field"] == "sequence"
    assert code(http.get(records, params={"curser": 3})) == (400, "invalid_input")
    assert code(http.get(records, params={"cursor": 9})) == (400, "invalid_cursor")
    with server.client() as c, connect_sse(c, "GET", f"{base}/out/subscribe", params={"cursor": 3}) as source:
        got = []
        for sse in source.iter_sse():
            if sse.data:
                got.append(orjson.loads(sse.data)["offset"])
                if len(got) == 2:
                    break
    assert got == [4, 5]
    assert code(http.get(f"{base}/out/subscribe", params={"offset": 3})) == (400, "invalid_input")
    # Acknowledged by sequence (or offset; both must agree).
    assert http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 2}).json()["acked"] == 2
    assert http.post(f"{base}/out/consumers/ui/ack", json={"offset": 3}).json()["acked"] == 3
    assert code(http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 4, "offset": 5})) == (400, "invalid_input")
    assert code(http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 1})) == (409, "ack_regression")


PINS = {
    "placement": {"metadata_home": "eu-west-1", "metadata_replicas": ["eu-central-1"], "object_regions": ["eu-west-1"],
                  "client_egress_regions": ["eu-west-1", "eu-central-1"], "log_region": "eu-west-1"},
    "redaction": [{"path": "$.payload.user.email", "lifted_by": ["pii:read"]},
                  {"path": "$.payload.items[*].card", "lifted_by": ["pci:read"]},
                  {"path": "$.metadata.ip", "lifted_by": ["pii:read"]}],
    "authorization": {"read": {"scopes": ["run:read", "admin"]}, "append": {"scopes": ["run:write", "admin"]}},
    "content_classes": ["model_output", "user_input"],
}
RECORD = {"type": "answer", "payload": {"user": {"email": "a@b.c", "name": "A"}, "items": [{"card": "4111"}, {"card": "5500"}]},
          "metadata": {"content_class": "model_output", "ip": "10.0.0.1"}}


def pinned_stream(http) -> str:
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    r = http.post(base, json={"stream_id": "answer", **PINS})
    assert r.status_code == 201, r.text
    return f"{base}/answer"


def test_a_definition_pins_its_data_handling(server, http):
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    r = http.post(base, json={"stream_id": "answer", **PINS})
    assert r.status_code == 201
    pins = r.json()["data_handling"]
    assert pins["placement"] == PINS["placement"] and pins["content_classes"] == PINS["content_classes"]
    assert pins["redaction"][1] == {"path": "$.payload.items[*].card", "lifted_by": ["pci:read"]}
    assert http.post(base, json={"stream_id": "answer", **PINS}).status_code == 200
    assert http.get(f"{base}/answer").json()["data_handling"] == pins
    other = {**PINS, "redaction": []}
    assert code(http.post(base, json={"stream_id": "answer", **other})) == (409, "stream_exists")
    # Invalid pins, refused before anything is written.
    for bad, field in [
        ({"redaction": [{"path": "$.other.x"}]}, "redaction.path"),
        ({"redaction": [{"path": "$.payload..x"}]}, "redaction.path"),
        ({"placement": {"log_region": "EU West"}}, "placement.log_region"),
        ({"placement": {"moon": "x"}}, "placement"),
        ({"authorization": {"read": {"subjects": ["bob"]}}}, "authorization.read.subjects"),
    ]:
        r = http.post(base, json={"stream_id": "bad", **bad})
        assert code(r) == (400, "invalid_input") and r.json()["error"]["field"] == field, (bad, r.text)
    r = http.post(base, json={"stream_id": "bad", "content_classes": ["model_output", "raw_hidden_model_reasoning"]})
    assert code(r) == (400, "content_class_refused")
    assert code(http.get(f"{base}/bad")) == (404, "stream_not_found")


def test_authorization_redaction_and_egress(server, http):
    url = pinned_stream(http)
    writer = server.new_token("default", "append,run:write")
    plain_reader = server.new_token("default", "read")
    reader = server.new_token("default", "read,run:read")
    pii_reader = server.new_token("default", "read,run:read,pii:read,pci:read")
    with server.client(writer) as w:
        assert w.post(f"{url}/records", json=RECORD).status_code == 201
        assert code(w.get(f"{url}/records")) == (403, "forbidden")  # no read scope at all
    with server.client(server.new_token("default", "append")) as w:
        r = w.post(f"{url}/records", json=RECORD)
        assert code(r) == (403, "forbidden") and r.json()["error"]["pinned"] is True
    with server.client(plain_reader) as c:
        assert code(c.get(f"{url}/records")) == (403, "forbidden")
        assert code(c.get(url)) == (403, "forbidden")
    with server.client(reader) as c:
        [record] = c.get(f"{url}/records").json()["events"]
        assert record["payload"] == {"user": {"email": "[redacted]", "name": "A"},
                                     "items": [{"card": "[redacted]"}, {"card": "[redacted]"}]}
        assert record["metadata"] == {"content_class": "model_output", "ip": "[redacted]"}
        with connect_sse(c, "GET", f"{url}/subscribe", params={"cursor": 0}) as source:
            frame = next(orjson.loads(s.data) for s in source.iter_sse() if s.data)
        assert frame["payload"]["user"]["email"] == "[redacted]" and frame["metadata"]["ip"] == "[redacted]"
    with server.client(pii_reader) as c:
        [record] = c.get(f"{url}/records").json()["events"]
        assert record["payload"] == RECORD["payload"] and record["metadata"]["ip"] == "10.0.0.1"
        with connect_sse(c, "GET", f"{url}/subscribe", params={"cursor": 0}) as source:
            frame = next(orjson.loads(s.data) for s in source.iter_sse() if s.data)
        assert frame["payload"] == RECORD["payload"]  # not the masked frame another reader caused
        # Client egress: a declared region outside the pinned set is refused.
        r = c.get(f"{url}/records", headers={"Client-Region": "us-east-1"})
        assert code(r) == (403, "egress_refused") and r.json()["error"]["allowed"] == ["eu-west-1", "eu-central-1"]
        assert c.get(f"{url}/records", headers={"Client-Region": "eu-central-1"}).status_code == 200
        assert code(c.get(f"{url}/subscribe", headers={"Client-Region": "us-east-1"})) == (403, "egress_refused")
    # Subjects: one token by its id.
    subject = server.new_token("default", "read")
    token_id = subject.split(".")[0].removeprefix("yk_")
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "s", "authorization": {"read": {"subjects": [token_id]}}}).status_code == 201
    with server.client(subject) as c:
        assert c.get(f"{base}/s/records").status_code == 200
    with server.client(plain_reader) as c:
        assert code(c.get(f"{base}/s/records")) == (403, "forbidden")


def test_content_classes(server, http):
    url = pinned_stream(http)
    assert http.post(f"{url}/records", json=RECORD).status_code == 201
    undeclared = {"type": "answer", "payload": 1}
    r = http.post(f"{url}/records", json=undeclared)
    assert code(r) == (400, "content_class_refused") and r.json()["error"]["allowed"] == ["model_output", "user_input"]
    other = {"type": "t", "metadata": {"content_class": "tool_trace"}}
    assert code(http.post(f"{url}/records", json=[RECORD, other])) == (400, "content_class_refused")
    hidden = {"type": "t", "metadata": {"content_class": "Raw-Hidden-Model-Reasoning"}}
    assert code(http.post(f"{url}/records", json=hidden)) == (400, "content_class_refused")
    assert len(http.get(f"{url}/records").json()["events"]) == 1  # nothing refused was written
    # Raw hidden model reasoning is refused on a stream that pins no classes too.
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "free"}).status_code == 201
    assert code(http.post(f"{base}/free/records", json=hidden)) == (400, "content_class_refused")
    assert http.post(f"{base}/free/records", json=other).status_code == 201


def test_generic_routes_refuse_a_stream_that_pins_data_handling(server, http):
    url = pinned_stream(http)
    path = "/runs/" + url.split("/runs/")[1].replace("/streams/", "/")
    prepare = {"idempotency_key": "k", "sha256": "0" * 64, "size": 1}
    for method, route, body in [("GET", "-/events", None), ("GET", "-/tail", None), ("POST", "-/events", {"type": "x"}),
                                ("GET", "", None), ("GET", "-/subscriptions", None), ("POST", "-/objects", prepare)]:
        r = http.request(method, f"/v1/streams{path}/{route}".rstrip("/"), json=body)
        assert code(r) == (403, "data_handling_pinned"), (method, route, r.text)
    # A workflow stream that pins nothing stays reachable.
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "free"}).status_code == 201
    plain = "/runs/" + base.split("/runs/")[1].replace("/streams", "/free")
    assert http.post(f"/v1/streams{plain}/-/events", json={"type": "x"}).status_code == 201


def test_input_records_wake_the_run(server, http):
    run = new_run()
    base = f"/api/workflow-streams/runs/{run}/streams"
    r = http.post(base, json={"stream_id": "in", "direction": "input"})
    assert r.status_code == 201 and r.json()["data_handling"]["direction"] == "input"
    assert code(http.post(base, json={"stream_id": "bad", "direction": "sideways"})) == (400, "invalid_input")
    one = http.post(f"{base}/in/records", json={"type": "question", "payload": "why?"}, headers={"Idempotency-Key": "q1"})
    assert one.status_code == 201
    assert http.post(f"{base}/in/records", json={"type": "question", "payload": "why?"},
                     headers={"Idempotency-Key": "q1"}).json() == one.json()
    batch = http.post(f"{base}/in/records", json=[{"type": "answer"}, {"type": "answer"}]).json()["results"]
    records = [one.json(), *batch]
    with server.client() as c, connect_sse(c, "GET", f"/v1/streams/runs/{run}/-/tail", params={"after": 0}) as source:
        wakes = []
        for sse in source.iter_sse():
            if sse.data:
                wakes.append(orjson.loads(sse.data))
                if len(wakes) == 3:
                    break
    assert [(w["type"], w["payload"]["sequence"], w["payload"]["record_id"]) for w in wakes] == [
        ("yoke.input.received", r["offset"], r["id"]) for r in records
    ]


def test_append_receipts_can_be_fetched_afterwards(server, http):
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "out"}).status_code == 201
    one = http.post(f"{base}/out/records", json={"type": "t", "payload": {"b": 1, "a": [1.5, "é"]}},
                    headers={"Idempotency-Key": "k1"}).json()
    receipt = one["receipt"]
    assert receipt["record_id"] == one["id"] and receipt["sequence"] == one["offset"] == 1
    assert receipt["digest"].startswith("sha256:") and len(receipt["digest"]) == 71
    assert receipt["at"] > 0
    # The same record again (its key): the same receipt.
    again = http.post(f"{base}/out/records", json={"type": "t", "payload": {"a": [1.5, "é"], "b": 1}},
                      headers={"Idempotency-Key": "k1"}).json()
    assert again == one
    batch = http.post(f"{base}/out/records", json=[{"type": "t", "payload": 2}, {"type": "p", "ephemeral": True},
                                                   {"type": "t", "payload": 2}]).json()["results"]
    assert batch[1]["receipt"] is None
    assert batch[0]["receipt"]["digest"] != batch[2]["receipt"]["digest"]  # ids differ
    for answer in (one, batch[0], batch[2]):
        fetched = http.get(f"{base}/out/receipts/{answer['offset']}").json()
        assert fetched == answer["receipt"]
    assert code(http.get(f"{base}/out/receipts/{batch[1]['offset']}")) == (404, "event_not_found")
    assert code(http.get(f"{base}/out/receipts/99")) == (404, "event_not_found")


def test_prepare_pins_schema_and_an_authorization_receipt(server, http):
    import hashlib

    data = b"{\"rows\": []}"
    digest = hashlib.sha256(data).hexdigest()
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "out"}).status_code == 201
    writer = server.new_token("default", "append")
    token_id = writer.split(".")[0].removeprefix("yk_")
    intent = {"idempotency_key": "o1", "sha256": digest, "size": len(data), "content_type": "application/json",
              "schema": "https://example.com/schemas/table-v1.json"}
    with server.client(writer) as w:
        obj = w.post(f"{base}/out/objects", json=intent).json()
        assert obj["schema"] == intent["schema"]
        receipt = obj["authorization"]
        assert receipt["subject"] == token_id and receipt["scopes"] == ["append"] and receipt["tenant"] == "default"
        assert receipt["intent"].startswith("sha256:") and receipt["at"] == obj["created_at"]
        # A repeat (another token, even) gets the original object and receipt.
    assert http.post(f"{base}/out/objects", json=intent).json() == obj
    changed = {**intent, "schema": "https://example.com/schemas/table-v2.json"}
    assert code(http.post(f"{base}/out/objects", json=changed)) == (409, "idempotency_conflict")
    assert http.put(f"{base}/out/objects/{obj['object_id']}", content=data).json()["authorization"] == receipt
    assert http.post(f"{base}/out/objects/{obj['object_id']}/commit").status_code == 201


def test_gap_evidence_is_served_to_operators(server, http):
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "g"}).status_code == 201
    assert http.get(f"{base}/g/gaps").json() == {"gaps": []}
    with server.client(server.new_token("default", "read")) as c:
        assert code(c.get(f"{base}/g/gaps")) == (403, "forbidden")
    assert code(http.get(f"{base}/g/gaps", params={"limit": 0})) == (400, "invalid_input")
    path = "/runs/" + base.split("/runs/")[1].replace("/streams", "/g")
    assert http.get(f"/v1/streams{path}/-/gaps").json() == {"gaps": []}


def test_a_console_session_meets_the_same_pins(server, http):
    url = pinned_stream(http)
    path = "/runs/" + url.split("/runs/")[1].replace("/streams/", "/")
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "free"}).status_code == 201
    plain = "/runs/" + base.split("/runs/")[1].replace("/streams", "/free")
    import httpx

    with httpx.Client(base_url=server.url) as browser:
        assert browser.post("/ui/session", json={"token": server.token}).status_code == 200
        assert code(browser.get(f"/v1/streams{path}/-/events")) == (403, "data_handling_pinned")
        assert browser.get(f"/v1/streams{plain}/-/events").status_code == 200


def test_defining_an_existing_stream_again_is_a_read_its_pins_decide(server, http):
    """Posting an existing definition again answers it: a read, which the
    stream's own authorization rule decides (an admin token the rule does not
    name is refused; one it names gets the 200)."""
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    definition = {"stream_id": "answer", "authorization": {"read": {"scopes": ["run:read"]}}}
    assert http.post(base, json=definition).status_code == 201
    r = http.post(base, json=definition)
    assert code(r) == (403, "forbidden") and r.json()["error"]["pinned"] is True
    named = server.new_token("default", "admin,run:read")
    with server.client(named) as c:
        assert c.post(base, json=definition).status_code == 200
