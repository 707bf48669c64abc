"""The SQLite commit's per-batch counts (durable events, bytes, offsets
taken): the fast path for batches of new durable events, side by side or
not, agrees with the event-by-event count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from yoke.events import prepare
from yoke.store.sqlite.appends import batch_counts

EVENT = st.one_of(
    st.builds(lambda n: {"type": "t", "payload": "x" * n}, st.integers(0, 40)),
    st.builds(lambda n: {"type": "t", "payload": n, "ephemeral": True}, st.integers(0, 9)),
    st.builds(lambda k: {"type": "t", "idempotency_key": f"k{k}"}, st.integers(0, 3)),
)


def one_by_one(events, batch_of, prior) -> dict[int, list[int]]:  # noqa: ANN001
    per_batch: dict[int, list[int]] = {}
    for e, b in zip(events, batch_of):
        counts = per_batch.setdefault(b, [0, 0, 0])
        if e.idempotency_key not in prior:
            counts[2] += 1
            if not e.ephemeral:
                counts[0] += 1
                counts[1] += e.size
    return per_batch


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(EVENT, st.integers(0, 4)), max_size=20), st.booleans(), st.booleans())
def test_counts_agree_with_the_event_by_event_count(pairs, sort, known_key):
    if sort:
        pairs.sort(key=lambda p: p[1])
    events = [prepare(raw) for raw, _ in pairs]
    batch_of = [b for _, b in pairs]
    prior = {"k1": (1, "id", 0, None)} if known_key else {}
    assert batch_counts(events, batch_of, prior) == one_by_one(events, batch_of, prior)
