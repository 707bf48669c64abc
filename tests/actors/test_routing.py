"""Filters and the fan-out index (no database)."""

from __future__ import annotations

import asyncio

import pytest

from yoke import App, Filter, InvalidFilter
from yoke.routing.evaluation import Evaluations
from yoke.routing.filters import path_matches
from yoke.routing.index import Route, RoutingIndex


def doc(type_: str, path: str = "/", **payload):
    return {"type": type_, "path": path, "payload": payload, "id": "e1"}


def targets(index: RoutingIndex, *documents):
    """The targets of each document (of the only one, when one is given)."""
    async def route():
        evaluations = Evaluations(2)
        try:
            return await index.targets("t", list(documents), evaluations)
        finally:
            await evaluations.close()

    found = asyncio.run(route())
    return found[0] if len(documents) == 1 else found


def test_types_exact_prefix_and_all() -> None:
    f = Filter(types=["order.*", "work.assigned"])
    assert f.matches_type("order.placed") and f.matches_type("order.line.added")
    assert f.matches_type("work.assigned") and not f.matches_type("work.done")
    assert not f.matches_type("orders.placed")
    assert Filter(types=["*"]).matches_type("anything")


def test_stream_globs() -> None:
    assert path_matches(["/orders/*"], "/orders/1")
    assert not path_matches(["/orders/*"], "/orders/1/lines")
    assert path_matches(["/orders/**"], "/orders/1/lines")
    assert not path_matches(["/orders/*"], "/")
    f = Filter(types=["*"], streams=["/orders/*"])
    assert f.matches(doc("x", "/orders/7")) and not f.matches(doc("x", "/users/7"))


def test_where_must_be_exactly_true() -> None:
    f = Filter(types=["*"], where='payload.role = "coder"')
    assert f.matches(doc("x", role="coder"))
    assert not f.matches(doc("x", role="tester"))
    truthy = Filter(types=["*"], where="payload.role")
    assert not truthy.matches(doc("x", role="coder"))  # a string is not true


@pytest.mark.parametrize("bad", ["payload.(", "payload.role = ", "$$$unknown("])
def test_unparseable_jsonata_is_rejected_with_the_parsers_message(bad: str) -> None:
    with pytest.raises(InvalidFilter) as info:
        Filter(types=["x"], where=bad)
    assert info.value.code == "invalid_filter"
    assert "not valid JSONata" in info.value.message


def test_invalid_filter_shapes() -> None:
    with pytest.raises(InvalidFilter):
        Filter(types=[])
    with pytest.raises(InvalidFilter):
        Filter(types=["bad type!"])
    with pytest.raises(InvalidFilter):
        Filter(types=["x"], streams=["no-slash"])
    with pytest.raises(InvalidFilter):
        Filter.from_dict({"types": ["x"], "bogus": 1})
    with pytest.raises(InvalidFilter):
        Filter.from_dict({"types": "x"})


def test_actor_registration_rejects_bad_jsonata() -> None:
    app = App()
    with pytest.raises(InvalidFilter):
        app.actor("a", filter={"types": ["x"], "where": "payload.("})
    with pytest.raises(InvalidFilter):
        app.actor("b", filter=Filter.from_dict({"types": ["x"], "key": "payload.("}))


def test_index_routes_by_type_then_expression() -> None:
    routes = [
        Route(Filter(types=["order.*"]), instance_id="i-prefix"),
        Route(Filter(types=["order.placed"], where="payload.total > 100"), instance_id="i-big"),
        Route(Filter(types=["*"], streams=["/audit"]), instance_id="i-audit"),
        Route(Filter(types=["order.placed"], key="payload.order_id"), actor="per-order"),
    ]
    index = RoutingIndex(routes)
    small = targets(index, doc("order.placed", total=5, order_id=7))
    assert {(t.instance_id, t.actor, t.key) for t in small} == {
        ("i-prefix", None, None), (None, "per-order", "7")
    }
    big = targets(index, doc("order.placed", total=500, order_id="a"))
    assert {t.instance_id or t.key for t in big} == {"i-prefix", "i-big", "a"}
    assert [t.instance_id for t in targets(index, doc("user.created", "/audit"))] == ["i-audit"]
    assert targets(index, doc("user.created", "/")) == []


def test_a_failing_expression_skips_the_route_only() -> None:
    index = RoutingIndex([
        Route(Filter(types=["x"], where="$number(payload.v) > 1"), instance_id="i-num"),
        Route(Filter(types=["x"]), instance_id="i-all"),
    ])
    assert [t.instance_id for t in targets(index, doc("x", v="not a number"))] == ["i-all"]


EXPRESSIONS = [
    "payload.k = 5", 'payload.k = "5"', "payload.k = true", "payload.k = null", "payload.a.b = 1",
    'payload.k = 5 and type = "x"', "payload.k > 3", "payload.items.n = 2", 'type = "x" and payload.k = 1',
]
DOCUMENTS = [
    {"k": 5}, {"k": 5.0}, {"k": "5"}, {"k": True}, {"k": 1}, {"k": None}, {}, {"k": [5]},
    {"a": {"b": 1}}, {"a": {"b": [1]}}, {"a": 1}, {"items": [{"n": 2}, {"n": 3}]}, {"k": {"x": 5}},
]


def _matches(expression: str, document) -> bool:
    try:
        return Filter(types=["x"], where=expression).matches(document)
    except InvalidFilter:  # fails to evaluate: the index skips the route
        return False


@pytest.mark.parametrize("payload", DOCUMENTS)
def test_the_equality_index_agrees_with_jsonata(payload) -> None:
    routes = [Route(Filter(types=["x"], where=e), instance_id=e) for e in EXPRESSIONS]
    document = {"type": "x", "path": "/", "payload": payload, "id": "e"}
    expected = {e for e in EXPRESSIONS if _matches(e, document)}
    got = {t.instance_id for t in targets(RoutingIndex(routes), document)}
    assert got == expected


def test_thousands_of_equality_filters_route_without_jsonata(monkeypatch) -> None:
    from yoke.routing import filters

    index = RoutingIndex(
        [Route(Filter(types=["job"], where=f"payload.k = {i}"), instance_id=f"i{i}") for i in range(5000)]
    )
    monkeypatch.setattr(filters, "evaluate", None)  # any JSONata run would now fail
    monkeypatch.setattr("yoke.routing.evaluation.outcome", None)
    assert [t.instance_id for t in targets(index, doc("job", k=4321))] == ["i4321"]


def test_expensive_expressions_route_as_light_ones_do() -> None:
    """Routes whose where or key is expensive (a regex) are decided in the
    evaluator processes, together with light ones, each as JSONata says."""
    index = RoutingIndex([
        Route(Filter(types=["x"], where="$contains(payload.s, /^ab+c$/)"), instance_id="i-regex"),
        Route(Filter(types=["x"], where='$contains(payload.s, "b")'), instance_id="i-light"),
        Route(Filter(types=["x"], key="$match(payload.s, /b+/).match"), actor="by-bs"),
        Route(Filter(types=["x"], where="$number(payload.s) > 1 or $contains(payload.s, /x/)"),
              instance_id="i-failing"),
    ])
    found = targets(index, doc("x", s="abbbc"), doc("x", s="ac"), doc("y", s="abc"))
    assert [{t.instance_id or t.key for t in ts} for ts in found] == [{"i-regex", "i-light", "bbb"}, set(), set()]
