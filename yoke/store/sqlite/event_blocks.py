"""How the SQLite store finds a stream's events by offset: through blocks.

Event rows live in ``event_rows``, keyed by their ``row_id`` (an INTEGER
PRIMARY KEY: SQLite's rowid, kept by VACUUM and a dump), in the order they
were written. A commit's rows for one stream go in side by side:
consecutive row ids for consecutive offsets. ``event_blocks`` holds one
row per such run, (tenant, stream, last offset, first offset, first row
id), where an index on (tenant, stream, offset) would hold an entry per
event: the writer writes half the bytes and spends a fifth less CPU a row
(bench/sqlite_offsets_index.py), and a read finds a run's rows by row id.

The invariant every statement here keeps and relies on: each stored event
of a stream, at offset ``seq``, lies in exactly one block of its stream
with ``first_seq <= seq <= last_seq``, at row id ``first_rowid + seq -
first_seq``; the blocks of a stream do not overlap. A row id inside a
block's range may hold no row (ephemeral events take offsets and no row;
retention deletes a prefix) or another stream's row (a block built from
rows with gaps between them, see BLOCKS_OF_NEW_ROWS), so a read checks
every row it finds against its block.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

# A stream's events after offset :after (through :hi when bounded), in
# offset order, columns from ``events e``; named parameters :t (tenant) and
# the stream's sid (``:s`` or an expression). Blocks are keyed by their last
# offset, so the first block a read needs is the first with last_seq > :after;
# a bounded read stops at the first block with last_seq >= :hi (a scalar
# subquery: SQLite cannot bound the key by first_seq). ORDER BY follows the
# loops' own order: no sort.
_SPAN = (
    "SELECT {columns} FROM event_blocks b, event_rows e"
    " WHERE b.tenant_id = :t AND b.sid = {sid} AND b.last_seq > :after{bound}"
    " AND e.row_id BETWEEN b.first_rowid + max(:after + 1 - b.first_seq, 0) AND b.first_rowid + {top} - b.first_seq"
    " AND e.sid = b.sid AND e.tenant_id = b.tenant_id AND e.seq - b.first_seq = e.row_id - b.first_rowid"
    "{where} ORDER BY b.last_seq{order}, e.row_id{order}"
)
_BOUND = (
    " AND b.last_seq <= coalesce((SELECT min(last_seq) FROM event_blocks"
    " WHERE tenant_id = :t AND sid = {sid} AND last_seq >= :hi), :hi)"
)


@functools.cache
def span(columns: str, *, bounded: bool = False, where: str = "", descending: bool = False, sid: str = ":s") -> str:
    """The SELECT of ``columns`` of a stream's events after offset :after
    (through :hi when ``bounded``), in offset order (``descending``: the other way),
    keeping only rows that also match ``where`` (SQL on ``e``)."""
    return _SPAN.format(
        columns=columns, sid=sid, bound=_BOUND.format(sid=sid) if bounded else "",
        top="min(:hi, b.last_seq)" if bounded else "b.last_seq",
        where=f" AND ({where})" if where else "", order=" DESC" if descending else "",
    )


def everything(t: str, s: int) -> dict[str, object]:
    """The parameters of a span over all of a stream's events."""
    return {"t": t, "s": s, "after": 0}


# The table's last row id (0 when empty): new rows take the ids after it.
LAST_ROW_ID = "SELECT coalesce(max(row_id), 0) FROM event_rows"

# Blocks for rows just inserted with row ids above :base, from the rows
# themselves (a fork's copied prefix; migration 0014 did the same for every
# row then stored): per stream in offset order, a new block begins where
# the offset and the row id do not advance by the same step.
BLOCKS_OF_NEW_ROWS = """
INSERT INTO event_blocks (tenant_id, sid, last_seq, first_seq, first_rowid)
SELECT tenant_id, sid, max(seq), min(seq), min(rid) FROM (
    SELECT tenant_id, sid, seq, rid,
           sum(brk) OVER (PARTITION BY tenant_id, sid ORDER BY seq ROWS UNBOUNDED PRECEDING) AS run
    FROM (
        SELECT tenant_id, sid, seq, row_id AS rid,
               coalesce(seq - lag(seq) OVER w <> row_id - lag(row_id) OVER w, 1) AS brk
        FROM event_rows WHERE row_id > :base
        WINDOW w AS (PARTITION BY tenant_id, sid ORDER BY seq)
    )
)
GROUP BY tenant_id, sid, run
"""

# A fork's copy of its source's events through :hi (stream :s) into stream
# :new, at the same offsets, in offset order: the copies take consecutive
# row ids after the table's last, for BLOCKS_OF_NEW_ROWS to find.
FORK_COPY = (
    "INSERT INTO event_rows (tenant_id, sid, seq, id, at, type, payload, metadata, source,"
    " correlation, priority, group_id, idempotency_key, fingerprint, size, data) "
    + span("e.tenant_id, :new, seq, id, at, type, payload, metadata, source, correlation,"
           " priority, group_id, NULL, NULL, size, data", bounded=True)
)

# The blocks that end at or before an offset go with their events (retention);
# the one that holds it keeps only what follows it.
DROP_BLOCKS_THROUGH = "DELETE FROM event_blocks WHERE tenant_id = :t AND sid = :s AND last_seq <= :hi"
TRIM_BLOCK_AFTER = (
    "UPDATE event_blocks SET first_rowid = first_rowid + :hi + 1 - first_seq, first_seq = :hi + 1"
    " WHERE tenant_id = :t AND sid = :s AND last_seq = (SELECT min(last_seq) FROM event_blocks"
    " WHERE tenant_id = :t AND sid = :s AND last_seq > :hi) AND first_seq <= :hi"
)

Run = tuple[str, int, int, int, int]  # (tenant, sid, last_seq, first_seq, first_rowid)


def runs(tenant: str, sid: int, seqs: Sequence[int], first_rowid: int) -> Iterator[Run]:
    """The blocks of rows inserted at rowids ``first_rowid``.. for the
    (increasing) offsets ``seqs``: a new one wherever an offset is skipped."""
    if not seqs:
        return
    if seqs[-1] - seqs[0] == len(seqs) - 1:  # no offset skipped: most commits
        yield (tenant, sid, seqs[-1], seqs[0], first_rowid)
        return
    start = 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i] != seqs[i - 1] + 1:
            yield (tenant, sid, seqs[i - 1], seqs[start], first_rowid + start)
            start = i


def merged(blocks: Iterable[Run]) -> list[Run]:
    """``blocks`` in write order, a block that continues the one before it
    (same stream, next offset at the next row id) joined to it."""
    out: list[Run] = []
    for b in blocks:
        if out:
            tenant, sid, last, first, rowid = out[-1]
            if (b[0], b[1]) == (tenant, sid) and b[3] == last + 1 and b[4] == rowid + (last - first) + 1:
                out[-1] = (tenant, sid, b[2], first, rowid)
                continue
        out.append(b)
    return out

