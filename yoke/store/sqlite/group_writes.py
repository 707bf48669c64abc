"""The writes a SQLite group commit holds back to its end.

The writer thread runs the commits waiting together in one transaction
(``SqliteDb._commit_group``, connection.py). Every statement hands the GIL back twice
(step, reset) and the event loop's thread is quick to take it, so the
writer waited for it after each one. Run without savepoints, a group's
commits need not write their event rows and stream heads one by one: they
are held back here and written together at the group's end (or before a
statement that must see them), in as few statements as their count allows.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ...events import PreparedEvent
from .event_blocks import LAST_ROW_ID, Run, merged, runs

INSERT_COLUMNS = (
    "tenant_id", "sid", "seq", "id", "at", "type", "payload", "metadata", "source",
    "correlation", "priority", "group_id", "idempotency_key", "fingerprint", "size", "data",
)
# PreparedEvent's name of each column that differs from the column's.
_FIELD_NAMES = {"payload": "payload_json", "metadata": "metadata_json", "source": "source_json"}
# The columns most events leave NULL: a chunk whose rows all do says NULL in
# the statement instead of binding None, which the sqlite3 module adapts
# through a slow lookup (about a fifth of the writer's time in batch appends).
_NULLABLE = tuple(i for i, c in enumerate(INSERT_COLUMNS) if c in {
    "source", "correlation", "group_id", "idempotency_key", "fingerprint", "data"})
_nullable_of = operator.attrgetter(*(_FIELD_NAMES.get(INSERT_COLUMNS[i], INSERT_COLUMNS[i]) for i in _NULLABLE))
_ALL_NULL = {(None,) * len(_NULLABLE)}
_ALL_NULLABLE = frozenset(_NULLABLE)
_TENANT, _SID, _SEQ = (INSERT_COLUMNS.index(c) for c in ("tenant_id", "sid", "seq"))
# Rows go in as multi-row INSERTs of power-of-two sizes up to this many
# (1024 x 16 parameters, well under SQLite's 32766): one statement steps once,
# where executemany steps a row at a time (100 rows beside a spinning thread:
# 465 ms stepped, 30 ms this way).
INSERT_CHUNK = 1024
HEADS_CHUNK = 256
BLOCKS_CHUNK = 256


class Block(NamedTuple):
    """A commit's durable events for the ``event_rows`` table: ``events[i]`` at
    offset ``seqs[i]`` of stream ``sid``, all appended at ``at``."""

    tenant: str
    sid: int
    at: int
    seqs: Sequence[int]
    events: Sequence[PreparedEvent]


# Each INSERT_COLUMNS value of a block's rows, by column: the block's own
# (None here) or the event's field.
_FIELD_OF: tuple[Callable[[PreparedEvent], Any] | None, ...] = tuple(
    None if c in {"tenant_id", "sid", "seq", "at"} else operator.attrgetter(_FIELD_NAMES.get(c, c))
    for c in INSERT_COLUMNS
)


def _chunks(items: Sequence[Any], cap: int) -> Iterator[Sequence[Any]]:
    """``items`` in chunks of power-of-two sizes up to ``cap``: a few
    statement shapes, each prepared once by the statement cache."""
    start = 0
    while start < len(items):
        n = min(cap, 1 << ((len(items) - start).bit_length() - 1))
        yield items[start : start + n]
        start += n


# The columns most chunks hold one value in (one tenant, one event type,
# metadata "{}", priority 0): a chunk whose rows all agree binds each once,
# as a numbered parameter every row names, instead of once a row (binding
# is most of the writer's Python time: 0.6-0.9 us a row less this way).
_SHARED = tuple(i for i, c in enumerate(INSERT_COLUMNS) if c in {"tenant_id", "type", "metadata", "priority"})
_shared_fields_of = operator.attrgetter("type", "metadata_json", "priority")  # with the block's tenant
_ALL_SHARED = frozenset(_SHARED)


@functools.lru_cache(maxsize=256)  # chunk sizes x NULL patterns met, like the statement cache
def _insert_sql(n: int, nulls: frozenset[int], shared: frozenset[int]) -> tuple[str, tuple[int, ...]]:
    """The INSERT of ``n`` rows at row ids ?1, ?1+1, .. whose columns
    ``nulls`` are all NULL and whose columns ``shared`` hold one value each
    (bound next, in column order), and the other columns, bound row by row."""
    once = {column: f"?{k}" for k, column in enumerate(sorted(shared), 2)}
    per_row = tuple(i for i in range(len(INSERT_COLUMNS)) if i not in nulls and i not in shared)
    rows = []
    k = len(once) + 2
    for r in range(n):
        cells = [f"?1+{r}"]
        for i in range(len(INSERT_COLUMNS)):
            if i in nulls:
                cells.append("NULL")
            elif i in once:
                cells.append(once[i])
            else:
                cells.append(f"?{k}")
                k += 1
        rows.append("(" + ",".join(cells) + ")")
    sql = f"INSERT INTO event_rows (row_id, {', '.join(INSERT_COLUMNS)}) VALUES " + ",".join(rows)
    return sql, per_row


def _pieces(blocks: Sequence[Block], cap: int) -> Iterator[list[Block]]:
    """The blocks' rows in chunks (_chunks' sizes), each a list of blocks
    (cut where a chunk ends)."""
    total = sum(len(b.seqs) for b in blocks)
    queue = list(reversed(blocks))
    for size in map(len, _chunks(range(total), cap)):
        chunk: list[Block] = []
        while size:
            block = queue.pop()
            if len(block.seqs) > size:
                queue.append(block._replace(seqs=block.seqs[size:], events=block.events[size:]))
                block = block._replace(seqs=block.seqs[:size], events=block.events[:size])
            chunk.append(block)
            size -= len(block.seqs)
        yield chunk


def _column(block: Block, i: int) -> Iterable[Any]:
    field = _FIELD_OF[i]
    if field is not None:
        return map(field, block.events)
    if i == _SEQ:
        return block.seqs
    return itertools.repeat(block.tenant if i == _TENANT else block.sid if i == _SID else block.at, len(block.seqs))


def insert_events(conn: sqlite3.Connection, blocks: Sequence[Block]) -> None:
    """Insert the blocks' event rows, and their rows in ``event_blocks``
    (event_blocks.py). The rows take the row ids after the table's last, in
    order, named in the statement (not left to SQLite's choice: the block
    rows say where they are). The values go to SQLite column by column at
    C speed (maps over the events), never as a tuple a row."""
    row_id = conn.execute(LAST_ROW_ID).fetchone()[0] + 1
    written: list[Run] = []
    for chunk in _pieces(blocks, INSERT_CHUNK):
        n = sum(len(b.seqs) for b in chunk)
        nullable = set().union(*(map(_nullable_of, b.events) for b in chunk))
        if nullable == _ALL_NULL:  # most chunks: one pass in C
            nulls = _ALL_NULLABLE
        else:
            nulls = frozenset(i for k, i in enumerate(_NULLABLE) if all(v[k] is None for v in nullable))
        shared_values = {(b.tenant, *v) for b in chunk for v in set(map(_shared_fields_of, b.events))}
        if len(shared_values) == 1:  # most chunks, again one pass in C
            shared, params = _ALL_SHARED, [row_id, *shared_values.pop()]
        else:
            shared, params = frozenset(), [row_id]
        sql, per_row = _insert_sql(n, nulls, shared)
        for b in chunk:
            params.extend(itertools.chain.from_iterable(zip(*(_column(b, i) for i in per_row))))
            written.extend(runs(b.tenant, b.sid, b.seqs, row_id))
            row_id += len(b.seqs)
        conn.execute(sql, params)
    rows = merged(written)
    for part in _chunks(rows, BLOCKS_CHUNK):
        conn.execute(_blocks_sql(len(part)), list(itertools.chain.from_iterable(part)))


@functools.lru_cache(maxsize=16)
def _blocks_sql(n: int) -> str:
    return (
        "INSERT INTO event_blocks (tenant_id, sid, last_seq, first_seq, first_rowid) VALUES "
        + ",".join(["(?,?,?,?,?)"] * n)
    )


@functools.lru_cache(maxsize=16)
def _heads_sql(n: int) -> str:
    return (
        "UPDATE streams SET head=v.column3, durable_events=durable_events+v.column4,"
        " durable_bytes=durable_bytes+v.column5, unread_events=unread_events+v.column6,"
        " unread_bytes=unread_bytes+v.column7"
        f" FROM (VALUES {','.join(['(?,?,?,?,?,?,?)'] * n)}) AS v"
        " WHERE streams.tenant_id=v.column1 AND streams.sid=v.column2"
    )


class GroupWrites:
    """Event rows and stream advances held back by a group's commits."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        # (tenant, sid) -> [head, durable events, durable bytes, unread events,
        # unread bytes] added: several commits on one stream add up.
        self.heads: dict[tuple[str, int], list[int]] = {}

    def advance(self, tenant: str, sid: int, head: int, events: int, size: int, unread: bool) -> None:
        """The stream's head is now ``head``, with ``events`` durable events
        of ``size`` bytes more (unread too when it has consumers)."""
        added = self.heads.get((tenant, sid))
        if added is None:
            self.heads[(tenant, sid)] = [head, events, size, events * unread, size * unread]
        else:
            added[0] = head
            added[1] += events
            added[2] += size
            added[3] += events * unread
            added[4] += size * unread

    def write(self, conn: sqlite3.Connection) -> None:
        """Write what is held back, in the open transaction."""
        if self.heads:
            heads = [(tenant, sid, *added) for (tenant, sid), added in self.heads.items()]
            self.heads = {}
            for chunk in _chunks(heads, HEADS_CHUNK):
                conn.execute(_heads_sql(len(chunk)), list(itertools.chain.from_iterable(chunk)))
        if self.blocks:
            blocks, self.blocks = self.blocks, []
            insert_events(conn, blocks)
