"""Routing keys: a plain path is walked directly; the answer is JSONata's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yoke.routing import filters
from yoke.routing.filters import compile_jsonata, key_of, key_text


def by_jsonata(expression: str, document: object) -> str | None:
    return key_text(compile_jsonata(expression, "key").evaluate(document))


DOCUMENTS = [
    {"payload": {"k": 7}},
    {"payload": {"k": "abc"}},
    {"payload": {"k": 2.0}},
    {"payload": {"k": 2.5}},
    {"payload": {"k": True}},
    {"payload": {"k": None}},
    {"payload": {"k": {"x": 1}}},
    {"payload": {"k": [1]}},
    {"payload": {"k": [1, 2]}},
    {"payload": [{"k": 1}, {"k": 2}]},
    {"payload": [{"k": 1}]},
    {"payload": {}},
    {"payload": "text"},
    {},
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("expression", ["payload.k", " payload.k ", "payload", "type"])
def test_a_plain_path_gives_what_jsonata_gives(expression, document):
    assert key_of(expression, document) == by_jsonata(expression, document)


def test_only_plain_paths_take_the_short_way():
    assert filters._plain_path("payload.customer_id") == ("payload", "customer_id")
    for expression in ("payload.k & 'x'", "$string(payload.k)", "payload[0].k", "true", "payload.null",
                       "payload.`k`", "payload.k.", "1"):
        assert filters._plain_path(expression) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["k", "a"]), inner, max_size=2),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(payload=json_values)
def test_any_payload_keys_as_jsonata_keys_it(payload):
    document = {"type": "t", "payload": payload}
    for expression in ("payload.k", "payload.k.a", "payload"):
        assert key_of(expression, document) == by_jsonata(expression, document)
