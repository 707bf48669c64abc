"""The journal of a run's effects (docs/advanced/effects.md, the default mode).

Every run of a queue row numbers its effect ops (appends, schedule upserts
and cancels, child instance creates, conversation posts) by content: the
digest of the op's name and canonical JSON params, and the occurrence of
that digest in the run (the first identical append is 0, the next 1...).
A retry of the row that makes an identical op gets the same (digest,
occurrence) and so the recorded result instead of a second effect; an op
whose content differs (it carries ``ctx.attempt``, say) has another digest
and is performed as new. Counting occurrences per digest rather than one
position for all ops keeps the match when a retry adds, drops or reorders
other ops (concurrent ops of one run have no stable order).

Appends carry the journal in their idempotency key (``yoke:run:...``,
through the append path's own duplicate check, DESIGN.md invariant 5); the
other effects record their result in ``actor_effects`` in the effect's
transaction (store/actors.py, ``Effect``).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import orjson

from ..store.actors import Effect

# The ops that are effects: journaled in the default mode, buffered in atomic mode.
EFFECT_OPS = frozenset(
    {"stream_append", "schedules_upsert", "schedules_cancel", "instances_create", "conversations_post"}
)


def digest(method: str, params: dict[str, Any]) -> str:
    """The op's content: its name and params as canonical JSON (sorted keys)."""
    text = orjson.dumps([method, params], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def run_idempotency_key(tenant: str, instance_id: str, qid: int, name: str) -> str:
    """A key for a call to the outside world, the same on every retry (and
    redrive) of the queue row and different for every other row."""
    # SHA-256 (not BLAKE2b as for digests): every host's language has it,
    # so a Node handler derives the same key.
    text = "\x1f".join((tenant, instance_id, str(qid), name)).encode()
    return "yk_" + hashlib.sha256(text).hexdigest()[:32]


class Journal:
    """The effect numbering of one run of queue row ``qid``."""

    def __init__(self, qid: int, instance_id: str) -> None:
        self.qid = qid
        self.instance_id = instance_id
        self._seen: Counter[str] = Counter()

    def effect(self, method: str, params: dict[str, Any]) -> Effect:
        d = digest(method, params)
        occurrence = self._seen[d]
        self._seen[d] += 1
        return Effect(self.qid, d, occurrence)

    def append_key(self, effect: Effect) -> str:
        """The idempotency key of a journaled append (at most ~100 characters)."""
        return f"yoke:run:{self.instance_id}:{effect.qid}:{effect.occurrence}:{effect.digest}"
