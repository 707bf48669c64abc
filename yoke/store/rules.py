"""Rules both drivers apply, as pure functions: each driver reads what a
rule needs under its own locks, calls the rule, and writes what it says
(the way ``subscriptions.Decide`` serves both drivers' ``control``)."""

from __future__ import annotations

from typing import Literal

from .. import errors


def check_ack(consumer_id: str, offset: int, head: int, acked: int | None) -> None:
    """An acknowledgement of ``offset`` by a consumer at ``acked`` (None: a
    new consumer) on a stream whose head is ``head``: acks only advance,
    and never past the head."""
    if offset > head:
        raise errors.InvalidAck(f"offset {offset} is beyond the head {head}", offset=offset, latest=head)
    if acked is not None and offset < acked:
        raise errors.AckRegression(
            f"consumer {consumer_id} already acknowledged {acked}",
            consumer=consumer_id, acked=acked, offset=offset,
        )


# How the unread counters follow the slowest consumer's move from one
# minimum acknowledgement to another: "same" (nothing to do), "none" (no
# consumer left: nothing counts as unread), "advance" (subtract the events
# after the old minimum through the new one), "recount" (count the events
# after the new minimum: a new consumer, or one went back by leaving).
Recount = Literal["same", "none", "advance", "recount"]


def unread_recount(old: int | None, new: int | None) -> Recount:
    if new == old:
        return "same"
    if new is None:
        return "none"
    if old is not None and new > old:
        return "advance"
    return "recount"


def age_cutoff(now: int, max_age_s: float) -> int:
    """Events appended before this time (ms) are past a ``max_age_s`` retention."""
    return now - int(max_age_s * 1000)


def prune_through(pruned_through: int, by_count: int | None, by_age: int | None) -> int | None:
    """The offset a retention pass removes events through: the highest that
    either rule reaches (``by_count``: the newest event beyond ``max_events``
    from the head; ``by_age``: the newest older than the cutoff; None where
    a rule removes nothing), or None when that removes nothing new."""
    through = max(by_count or 0, by_age or 0)
    return through if through > pruned_through else None


def unread_floor(min_ack: int | None, through: int) -> int:
    """Pruned events after this offset were unread (none without consumers)."""
    return min_ack if min_ack is not None else through
