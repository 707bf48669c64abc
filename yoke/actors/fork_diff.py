"""What differs between two runs of an instance's history: a fork and the
live instance, or two forks (docs/advanced/forks.md).

Three parts, each from plain values (database images and run reports), so
the diff runs anywhere the two are read:

- ``state``: the ``ctx.state`` document. Two objects compare key by key
  (added, removed, changed with both values); anything else as a whole
  (the key ``""``).
- ``tables``: every ``ctx.sqlite`` table (Yoke's own ``_yoke_*`` tables
  aside), row by row by its primary key, else its rowid: rows only in
  one, and rows whose values differ (with both).
- ``effects`` and ``outcomes``, per input: the effect ops (by op and
  params; answers aside) only in one side or changed (the same op at the
  same place with other params), and runs that ended otherwise.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

import orjson

from .journal import EFFECT_OPS

INTERNAL_PREFIX = "_yoke"


def open_image(image: bytes) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    if image:
        conn.deserialize(image)
    return conn


def state_of(conn: sqlite3.Connection) -> Any:
    try:
        row = conn.execute("SELECT value FROM _yoke_state WHERE id = 1").fetchone()
    except sqlite3.OperationalError:  # no state kept yet
        return None
    return None if row is None else orjson.loads(row[0])


def diff_state(live: Any, fork: Any) -> dict[str, Any]:
    added: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    changed: dict[str, Any] = {}
    if isinstance(live, dict) and isinstance(fork, dict):
        for key in sorted(set(live) | set(fork)):
            if key not in live:
                added[key] = fork[key]
            elif key not in fork:
                removed[key] = live[key]
            elif not same(live[key], fork[key]):
                changed[key] = {"live": live[key], "fork": fork[key]}
    elif not same(live, fork):
        changed[""] = {"live": live, "fork": fork}
    return {"added": added, "removed": removed, "changed": changed}


def same(a: Any, b: Any) -> bool:
    """Equal as JSON documents (1 and 1.0 are not the same document)."""
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        if not r[0].startswith(INTERNAL_PREFIX) and not r[0].startswith("sqlite_")
    ]


def _rows(conn: sqlite3.Connection, table: str) -> dict[str, dict[str, Any]]:
    """The table's rows by key (its primary key's values, else its rowid), as JSON text."""
    quoted = '"' + table.replace('"', '""') + '"'
    info = conn.execute(f"PRAGMA table_info({quoted})").fetchall()
    pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    key_sql = ", ".join('"' + c.replace('"', '""') + '"' for c in pk) if pk else "rowid"
    cursor = conn.execute(f"SELECT {key_sql}, * FROM {quoted}")
    names = [d[0] for d in cursor.description][len(pk) or 1:]
    rows: dict[str, dict[str, Any]] = {}
    for values in cursor:
        key = values[: len(pk) or 1]
        rows[orjson.dumps([_json_value(v) for v in key]).decode()] = {
            name: _json_value(v) for name, v in zip(names, values[len(pk) or 1:], strict=True)
        }
    return rows


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$blob": value.hex()}
    return value


def diff_tables(live: sqlite3.Connection, fork: sqlite3.Connection) -> dict[str, Any]:
    out: dict[str, Any] = {}
    in_live, in_fork = set(_tables(live)), set(_tables(fork))
    for table in sorted(in_live | in_fork):
        a = _rows(live, table) if table in in_live else {}
        b = _rows(fork, table) if table in in_fork else {}
        added = [{"key": orjson.loads(k), "row": b[k]} for k in sorted(set(b) - set(a))]
        removed = [{"key": orjson.loads(k), "row": a[k]} for k in sorted(set(a) - set(b))]
        changed = [
            {"key": orjson.loads(k), "live": a[k], "fork": b[k]}
            for k in sorted(set(a) & set(b)) if not same(a[k], b[k])
        ]
        if added or removed or changed:
            out[table] = {"added": added, "removed": removed, "changed": changed}
    return out


def effects_of(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The effect ops of a run, without their answers."""
    return [{"op": o["op"], "params": o["params"]} for o in ops if o["op"] in EFFECT_OPS]


def diff_effects(live: list[dict[str, Any]], fork: list[dict[str, Any]]) -> dict[str, Any]:
    """Effects of one input: matched by content (op and params); what is
    left is paired by op in order (changed), the rest only on one side."""
    key = lambda e: orjson.dumps(e, option=orjson.OPT_SORT_KEYS)  # noqa: E731
    common = Counter(key(e) for e in live) & Counter(key(e) for e in fork)
    left_live, left_fork = [], []
    for side, out in ((live, left_live), (fork, left_fork)):
        budget = Counter(common)
        for e in side:
            if budget[key(e)] > 0:
                budget[key(e)] -= 1
            else:
                out.append(e)
    changed = []
    for e in list(left_live):
        partner = next((f for f in left_fork if f["op"] == e["op"]), None)
        if partner is not None:
            left_live.remove(e)
            left_fork.remove(partner)
            changed.append({"op": e["op"], "live": e["params"], "fork": partner["params"]})
    return {"only_live": left_live, "only_fork": left_fork, "changed": changed}


def diff_runs(live: dict[Any, dict[str, Any]], fork: dict[Any, dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """Per input (keyed by seq; each side ``{"outcome", "error", "effects"}``):
    the effect differences and the outcome differences."""
    effects, outcomes = [], []
    for seq in sorted(set(live) | set(fork), key=lambda s: (0, s, "") if isinstance(s, int) else (1, 0, str(s))):
        a, b = live.get(seq), fork.get(seq)
        d = diff_effects(a["effects"] if a else [], b["effects"] if b else [])
        if d["only_live"] or d["only_fork"] or d["changed"]:
            effects.append({"seq": seq, **d})
        if (a and a["outcome"]) != (b and b["outcome"]):
            outcomes.append({
                "seq": seq, "live": a and a["outcome"], "fork": b and b["outcome"],
                "live_error": a and a.get("error"), "fork_error": b and b.get("error"),
            })
    return effects, outcomes


def diff_images(live_image: bytes, fork_image: bytes) -> dict[str, Any]:
    live, fork = open_image(live_image), open_image(fork_image)
    try:
        return {"state": diff_state(state_of(live), state_of(fork)), "tables": diff_tables(live, fork)}
    finally:
        live.close()
        fork.close()
