"""A corrected replay's patch is RFC 7386 JSON Merge Patch: the RFC's own
examples (Appendix A), and what a patch makes of an event's fields."""

from __future__ import annotations

import pytest

from yoke.failures.model import merge_patch, patched

# RFC 7386, Appendix A: (original, patch, result).
RFC_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("original", "patch", "result"), RFC_EXAMPLES)
def test_the_rfc_examples(original, patch, result) -> None:  # noqa: ANN001
    assert merge_patch(original, patch) == result


def test_the_original_is_not_changed() -> None:
    original = {"a": {"b": 1}}
    merge_patch(original, {"a": {"b": 2, "c": 3}})
    assert original == {"a": {"b": 1}}


def test_a_patch_names_the_fields_it_changes() -> None:
    event = {"id": "e1", "type": "bill", "payload": {"amount": 10, "customer": "c1"}, "metadata": {"via": "web"}}
    assert patched(event, {"payload": {"amount": 12}}) == {"payload": {"amount": 12, "customer": "c1"}}
    assert patched(event, {"type": "bill.fixed"}) == {"type": "bill.fixed"}
    assert patched(event, {"metadata": None}) == {"metadata": {}}  # removed whole: no metadata
    assert patched(event, {"payload": None}) == {"payload": None}
