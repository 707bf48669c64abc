"""read_json: a body's value exactly as the standard library reads it
(integers beyond 64 bits exact, so validation can refuse them by name),
and whether orjson read it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yoke import errors
from yoke.http.responses import read_json

# Integers on both sides of what orjson reads exactly (-2^63 .. 2^64 - 1),
# and strings that hold the "+" the fast check looks for.
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet="ab+e1 "),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet="ab+", max_size=3), inner, max_size=4),
    max_leaves=12,
)


def exact(body: bytes):
    return json.loads(body)


def same(a, b) -> bool:
    """Equal, and the same types throughout (1 == 1.0 would hide a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=500, deadline=None)
@given(VALUES)
def test_the_value_is_the_standard_librarys(value):
    body = json.dumps(value).encode()
    assert same(read_json(body)[0], exact(body))


@pytest.mark.parametrize(
    "body",
    [
        b'[18446744073709551616]',  # 2^64: orjson reads a float
        b'{"x": -9223372036854775809}',  # below -2^63
        b'{"a": "1e+5", "x": 123456789012345678901234567890}',  # a "+" elsewhere, and a long integer
        b'{"x": 18446744073709551615, "y": -9223372036854775808}',  # the edges orjson reads exactly
        b'{"ns": 1733011200123456789}',
    ],
)
def test_long_integers_read_exactly(body):
    assert same(read_json(body)[0], exact(body))


def test_a_float_of_any_size_stays_a_float():
    value, by_orjson = read_json(b'[1e300, 1e16, -2.5e+20]')
    assert same(value, [1e300, 1e16, -2.5e20]) and by_orjson  # no long integer in the body: orjson's value
    value, _ = read_json(b'[12345678901234567890.0, 1e+5]')  # the scan finds 20 digits: read exactly
    assert same(value, [12345678901234567890.0, 1e5])


def test_nesting_deeper_than_orjson_writes_still_reads():
    body = b"[" * 300 + b"1" + b"]" * 300  # orjson reads 1,024 levels and writes 254
    value, _ = read_json(body)
    for _ in range(300):
        (value,) = value
    assert value == 1


@pytest.mark.parametrize("body", [b"", b"{", b"[1,]", b"NaN"])
def test_invalid_json_is_refused(body):
    with pytest.raises(errors.InvalidInput):
        read_json(body)
