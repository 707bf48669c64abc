"""The value domain: what goes in comes out unchanged, or is refused whole.

Inside the domain (JSON with signed 64-bit integers, finite floats, text
without NUL, nesting up to ``MAX_DEPTH``) a value reads back equal and of
the same types on both backends; ints and floats stay apart, -0.0 stays
-0.0. Anything outside is ``invalid_event`` naming the field, and a batch
holding it appends nothing. Sizes are UTF-8 bytes of the serialized event.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yoke import errors
from yoke.events import MAX_DEPTH, MAX_EVENT_BYTES, MAX_INT, MIN_INT

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
ASTRAL = st.text(st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF, blacklist_categories=("Cs",)), min_size=1, max_size=5)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.sampled_from([MIN_INT, MAX_INT, 0, -1, 2**53 + 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 0.0, 1e18, 1e16, 1e300, 5e-324, 100.0, 1.5e-300])
    | TEXT
    | ASTRAL
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT | ASTRAL, inner, max_size=5),
    max_leaves=25,
)

OUTSIDE = st.sampled_from(
    [math.nan, math.inf, -math.inf, MAX_INT + 1, MIN_INT - 1, 2**64 - 1, 2**64, 10**30]
)

PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 != 1.0, -0.0 != 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def with_leaf(value: Any, leaf: Any, where: int) -> Any:
    """``value`` with ``leaf`` placed inside it (or beside it)."""
    if isinstance(value, list):
        return [*value[:where], leaf, *value[where:]]
    if isinstance(value, dict):
        return {**value, "bad": leaf}
    return [value, {"deep": [leaf]}]


@PROPERTY
@given(value=VALUES)
async def test_values_in_the_domain_read_back_unchanged(y, tenant, value):
    s = y.stream("/values/" + uuid.uuid4().hex[:8], tenant=tenant)
    r = await s.append({"type": "v", "payload": value, "metadata": {"m": value}, "source": {"s": value}})
    event = await s.get(r.offset)
    assert same(event.payload, value), (event.payload, value)
    assert same(event.metadata, {"m": value})
    assert same(event.source, {"s": value})


@PROPERTY
@given(value=VALUES, leaf=OUTSIDE, where=st.integers(0, 5), field=st.sampled_from(["payload", "metadata", "source"]))
async def test_values_outside_the_domain_are_refused_whole(y, tenant, value, leaf, where, field):
    s = y.stream("/values/" + uuid.uuid4().hex[:8], tenant=tenant)
    bad = with_leaf(value, leaf, where)
    if field != "payload":
        bad = {"x": bad}
    with pytest.raises(errors.InvalidEvent) as exc:
        await s.append_many([{"type": "ok"}, {"type": "bad", field: bad}])
    assert exc.value.code == "invalid_event"
    assert exc.value.details["field"].startswith(field)
    with pytest.raises(errors.StreamNotFound):
        await s.info()  # nothing appended, no offset taken


@pytest.mark.parametrize(
    "payload, field, says",
    [
        ({"x": math.nan}, "payload.x", "NaN"),
        ({"x": [1, math.inf]}, "payload.x[1]", "infinities"),
        ({"a": {"b": -math.inf}}, "payload.a.b", "infinities"),
        ({"x": 2**63}, "payload.x", "64-bit"),
        ({"x": -(2**63) - 1}, "payload.x", "64-bit"),
        ({"x": 2**64}, "payload.x", "64-bit"),
        ({"x": 12345678901234567890123}, "payload.x", "64-bit"),
    ],
)
async def test_refusals_name_the_field(y, tenant, payload, field, says):
    s = y.stream("/refused", tenant=tenant)
    with pytest.raises(errors.InvalidEvent) as exc:
        await s.append_many([{"type": "ok"}, {"type": "bad", "payload": payload}])
    assert (exc.value.code, exc.value.http_status) == ("invalid_event", 400)
    assert exc.value.details["field"] == field
    assert says in exc.value.message
    with pytest.raises(errors.StreamNotFound):
        await s.info()


async def test_integer_bounds_and_floats_stay_apart(y, tenant):
    s = y.stream("/numbers", tenant=tenant)
    payload = {
        "min": MIN_INT, "max": MAX_INT, "float_1e18": 1e18, "int_1e18": 10**18, "hundred": 100.0,
        "neg_zero": -0.0, "zero": 0, "tiny": 5e-324, "huge": 1e300,
    }
    r = await s.append({"type": "n", "payload": payload})
    assert same((await s.get(r.offset)).payload, payload)


async def test_nesting_depth_is_capped(y, tenant):
    s = y.stream("/deep", tenant=tenant)
    deepest = nested(MAX_DEPTH)
    r = await s.append({"type": "d", "payload": deepest})
    assert same((await s.get(r.offset)).payload, deepest)
    for too_deep in (nested(MAX_DEPTH + 1), nested(300)):
        with pytest.raises(errors.InvalidEvent) as exc:
            await s.append({"type": "d", "payload": too_deep})
        assert f"deeper than {MAX_DEPTH}" in exc.value.message
    assert (await s.info()).head == 1


async def test_datetimes_and_dataclasses_are_refused_not_converted(y, tenant):
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class Point:
        x: float

    s = y.stream("/dt", tenant=tenant)
    for value in (datetime.datetime.now(), datetime.date.today(), Point(1.0), Point(math.nan)):
        with pytest.raises(errors.InvalidEvent):
            await s.append({"type": "d", "payload": {"v": value}})
    with pytest.raises(errors.StreamNotFound):
        await s.info()


async def test_uuids_and_enums_are_written_as_their_json_value(y, tenant):
    """Documented conversions (docs/reference/events.md): they read back as str / int."""
    import enum
    import uuid as uuid_module

    class Colour(enum.Enum):
        RED = 1

    u = uuid_module.uuid4()
    s = y.stream("/conv", tenant=tenant)
    r = await s.append({"type": "c", "payload": {"id": u, "colour": Colour.RED, "tuple": (1, 2)}})
    assert (await s.get(r.offset)).payload == {"id": str(u), "colour": 1, "tuple": [1, 2]}


# --- sizes are UTF-8 bytes ------------------------------------------------------

FOUR_BYTES = "\U0001F600"  # one character, four bytes in UTF-8


def event_with_bytes(size: int) -> dict[str, Any]:
    """An event of type 't' whose serialized size is exactly ``size``: the
    envelope allowance is 64, the empty metadata {} is 2, {"s":""} is 8."""
    room = size - 64 - 1 - 2 - 8
    return {"type": "t", "payload": {"s": FOUR_BYTES * (room // 4) + "x" * (room % 4)}}


async def test_the_size_cap_counts_utf8_bytes(y, tenant):
    s = y.stream("/sizes", tenant=tenant)
    r = await s.append(event_with_bytes(MAX_EVENT_BYTES))
    assert (await s.info()).usage.durable_bytes == MAX_EVENT_BYTES
    assert (await s.get(r.offset)).payload["s"].startswith(FOUR_BYTES)
    with pytest.raises(errors.EventTooLarge) as exc:
        await s.append(event_with_bytes(MAX_EVENT_BYTES + 1))
    assert exc.value.details == {"size": MAX_EVENT_BYTES + 1, "limit": MAX_EVENT_BYTES}
    # 65,000 four-byte characters: 260,000 bytes though only 65,000 characters.
    with pytest.raises(errors.EventTooLarge):
        await s.append({"type": "t", "payload": FOUR_BYTES * 65_000})
    with pytest.raises(errors.EventTooLarge):
        await s.append({"type": "t", "payload": {}, "correlation": FOUR_BYTES * 256, "metadata": {"m": FOUR_BYTES * 16_300}})
    assert (await s.info()).head == 1


async def test_credit_ceilings_count_utf8_bytes(y, tenant):
    from yoke.store.contract import Limits

    s = y.stream("/credit", tenant=tenant)
    await s.create(limits=Limits(max_total_bytes=10_000))
    # 3,000 characters, 12,000+ bytes: over the 10,000-byte ceiling.
    with pytest.raises(errors.QuotaExhausted):
        await s.append({"type": "t", "payload": FOUR_BYTES * 3_000})
    await s.append(event_with_bytes(6_000))
    assert (await s.info()).usage.durable_bytes == 6_000
    with pytest.raises(errors.QuotaExhausted):
        await s.append(event_with_bytes(4_001))
    await s.append(event_with_bytes(4_000))
    assert (await s.info()).usage.durable_bytes == 10_000
