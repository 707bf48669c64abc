"""Every value SQLite can return crosses to both hosts and back exactly
(yoke/hosts/wire.py: BLOBs, integers beyond 2**53 and infinities tagged),
and a failing op or an unencodable value reaches the handler as a YokeError
at once. Before, a BLOB in a query's rows could not be encoded for the
host and the run hung until its timeout.

The rows are drawn by hypothesis (with the boundaries added by hand) and
sent through a Python host process and the Node host in one runtime."""

from __future__ import annotations

import math

import pytest
import yoke
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from yoke.hosts.wire import sql_from_wire, sql_to_wire

from . import sqlite_values_app

SQLITE_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),  # events carry them: no NUL
    st.binary(max_size=64),
)
EDGES = [2**53 - 1, 2**53, -(2**53), 2**63 - 1, -(2**63), 0, -1, 1.5, -0.0, 1e308, 5e-324,
         math.inf, -math.inf, b"", b"\x00\xff\xfe", "", "é😀", None]


def drawn_rows(count: int) -> list[list[object]]:
    rows: list[list[object]] = []

    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate])
    @given(st.lists(SQLITE_VALUES, min_size=1, max_size=8))
    def draw(row: list[object]) -> None:
        rows.append(row)

    draw()
    return [EDGES, *rows]


def same(value: object, back: object, *, javascript: bool) -> bool:
    if isinstance(value, float) and isinstance(back, (int, float)) and not isinstance(back, bool):
        return value == back  # a JavaScript number that is whole goes back as an INTEGER
    if javascript and isinstance(value, int) and isinstance(back, float):
        return value == back
    return type(value) is type(back) and value == back


@pytest.mark.parametrize("host", ["py", "js"])
async def test_sqlite_values_cross_the_host_seam_exactly(host: str, tmp_path) -> None:
    rows = drawn_rows(40)
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=sqlite_values_app.app, data_dir=str(tmp_path)) as y:
        for n, row in enumerate(rows):
            await y.stream("/").append({"type": "values", "payload": {"who": f"r{n}", "values": [sql_to_wire(v) for v in row]}})
        await y.wait_idle(timeout_s=120)
        instances = y.instances()
        for n, row in enumerate(rows):
            found = await instances.find(host, f"r{n}")
            assert found is not None
            state, _ = await instances.state(found.instance_id)
            back = [sql_from_wire(v) for v in state["back"]]
            assert len(back) == len(row)
            for value, got, kind in zip(row, back, state["types"], strict=True):
                assert same(value, got, javascript=host == "js"), (value, got, kind)
                if isinstance(value, (bytes, str)) or value is None:
                    assert kind == {bytes: "blob", str: "text", type(None): "null"}[type(value)]


async def test_a_failing_op_or_an_unencodable_value_is_a_yoke_error_in_the_handler_at_once(tmp_path) -> None:
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=sqlite_values_app.app, data_dir=str(tmp_path)) as y:
        await y.stream("/").append({"type": "bad", "payload": {"who": "b"}})
        await y.wait_idle(timeout_s=15)  # each handler's timeout is 20 s: a hang fails here
        instances = y.instances()
        py = await instances.find("bad_py", "b")
        js = await instances.find("bad_js", "b")
        assert py is not None and js is not None
        assert (await instances.state(py.instance_id))[0] == {"error": "invalid_input"}
        assert (await instances.state(js.instance_id))[0] == {
            "op": "invalid_input", "params": "invalid_input", "surrogate": "invalid_input",
        }
