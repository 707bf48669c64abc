"""A batch's JSON texts: checked in one pass, the same texts and errors as
one json_text per value; batch event ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yoke import errors
from yoke.events import MAX_DEPTH, json_text, json_texts, new_event_ids
from yoke.http.durable_streams.messages import MESSAGE_OVERHEAD, events_of

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def one_by_one(values: list) -> list[str] | str:
    try:
        return [json_text(v, "message") for v in values]
    except errors.YokeError as exc:
        return exc.message


def at_once(values: list) -> list[str] | str:
    try:
        return json_texts(values, "message")
    except errors.YokeError as exc:
        return exc.message


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON, max_size=6))
def test_the_batch_gives_the_texts_and_errors_of_one_value_at_a_time(values):
    assert at_once(values) == one_by_one(values)


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "values",
    [
        [nested(MAX_DEPTH)],
        [1, nested(MAX_DEPTH + 1)],
        [2**63 - 1, -(2**63)],
        [{"a": 2**63}],
        [{"a": None}, None],
        [float("nan")],
        [{"t": "a\x00b"}],
        ["\\u0000 is text"],
        [{"b": [None, 2**60, 1.5]}],
    ],
)
def test_edges_of_the_value_domain(values):
    assert at_once(values) == one_by_one(values)


def test_batch_ids_are_distinct_and_share_the_time_prefix():
    ids = new_event_ids(1000)
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:12] for i in ids}) == 1


def test_a_message_size_counts_utf8_bytes():
    (event,) = events_of('{"text": "größe €"}'.encode(), "application/json")
    assert event.size == len(event.payload_json.encode()) + MESSAGE_OVERHEAD
    assert event.size > len(event.payload_json) + MESSAGE_OVERHEAD


def test_batch_ids_of_every_size():
    assert new_event_ids(0) == []
    for n in (1, 2, 7):
        ids = new_event_ids(n)
        assert len(ids) == n and len(set(ids)) == n
        assert all(len(i) == 32 and i == i.lower() and int(i, 16) >= 0 for i in ids)


TEXT_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def body_texts(body: bytes) -> list[str] | str:
    try:
        return [e.payload_json for e in events_of(body, "application/json")]
    except errors.YokeError as exc:
        return exc.message


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXT_JSON, min_size=1, max_size=6), st.sampled_from(["", "1e400", "-1e999", '"\\u0000"']))
def test_a_protocol_batch_gives_the_texts_and_errors_of_one_value_at_a_time(values, extra):
    """A POST body read by orjson skips the NaN check (JSON text has none);
    one orjson cannot read (a number beyond a double) goes the careful way."""
    import json

    body = json.dumps(values).encode()
    if extra:
        body = body[:-1] + b"," + extra.encode() + b"]"
    expected = one_by_one(json.loads(body, parse_constant=lambda c: float(c)))
    assert body_texts(body) == expected


def test_a_message_event_is_a_whole_prepared_event():
    """ds.message events carry only their id, text and size; every other
    field reads as a PreparedEvent built in full would give it."""
    from yoke.events import PreparedEvent
    from yoke.http.durable_streams.messages import MESSAGE_TYPE

    (event,) = events_of(b'[{"b": 1, "a": 2}]', "application/json")
    whole = PreparedEvent(event.id, MESSAGE_TYPE, '{"a":2,"b":1}', "{}", None, None, 0, None, None, False, None,
                          len('{"a":2,"b":1}') + MESSAGE_OVERHEAD)
    assert isinstance(event, PreparedEvent)
    assert [getattr(event, f) for f in PreparedEvent.__slots__] == [getattr(whole, f) for f in PreparedEvent.__slots__]
