"""Where JSONata runs (routing/evaluation.py, pool.py, cost.py): light
expressions on the event loop, expensive ones in evaluator processes, with
the same answers, tenants taking turns, and a stuck process replaced. No
database."""

from __future__ import annotations

import asyncio
import time

import pytest

from yoke import errors
from yoke.routing import evaluation, pool
from yoke.routing.cost import expensive
from yoke.routing.evaluation import Evaluations, Failed
from yoke.routing.filters import Filter, outcome

BACKTRACKS = "$contains(payload.s, /(a|aa)+$/)"  # about 2^40 steps on 40 a's and a b
HOSTILE = {"type": "s", "path": "/", "payload": {"s": "a" * 40 + "b"}}


@pytest.mark.parametrize("expression", [
    "payload.amount > 10", 'payload.customer = "c1" and payload.amount > 10', 'type in ["a", "b"]',
    "payload.items[price > 10].sku", '$contains(payload.s, "x")', "$exists(payload.x) ? 1 : 2",
    "payload.**.x = 1", '{"type": type, "payload": payload}', '$string(payload) = "x"', "payload{type: $count($)}",
])
def test_light_expressions(expression: str) -> None:
    assert not expensive(expression)


@pytest.mark.parametrize("expression", [
    BACKTRACKS, "$count($match(payload.s, /a/)) > 0", "(function($f){$f($f)})(function($f){$f($f)})",
    '$eval("1")', "[1..5]", "Account.Order@$o.Product", "Account.Order#$i", "$sort(a)", "($x := 1; $x)",
    "payload.s ~> $uppercase()", "$map(a, $string)", "$distinct(a)", '$pad("", 1000000)',
    "a ~> |b|{'c': 1}|",
])
def test_expensive_expressions(expression: str) -> None:
    assert expensive(expression)


DOCUMENTS = [
    {"type": "order", "path": "/o", "payload": {"s": "abbbc", "amount": 12, "items": [{"n": 1}, {"n": 2}]}},
    {"type": "order", "path": "/o", "payload": {"s": "ac", "amount": 3}},
    {"type": "order", "path": "/o", "payload": {"s": 5}},
]
CASES = [
    ("where", "payload.amount > 10"),
    ("where", "$contains(payload.s, /^ab+c$/)"),
    ("where", "$number(payload.s) > 1"),  # fails on the strings
    ("key", "payload.s"),
    ("key", "$match(payload.s, /b+/).match"),
    ("transform", '{"payload": {"n": $count(payload.items), "s": $uppercase(payload.s)}}'),
    ("transform", '{"payload": $map(payload.items, function($i){$i.n * 2})}'),
    ("transform", "function($x){$x}"),  # not JSON
]


def _expected(expression: str, what: str) -> list:
    out = []
    for document in DOCUMENTS:
        try:
            value = outcome(expression, document, what)
        except Exception:  # noqa: BLE001
            out.append(Failed)
            continue
        out.append(value if isinstance(value, (dict, list, str, int, float, bool, type(None))) else Failed)
    return out


@pytest.mark.parametrize(("what", "expression"), CASES)
async def test_the_processes_answer_as_the_loop_does(what: str, expression: str) -> None:
    evaluations = Evaluations(2)
    try:
        got = await evaluations.pool.run("t", expression, what, DOCUMENTS, False)
        answers = await evaluations.run("t", expression, what, DOCUMENTS)
    finally:
        await evaluations.close()
    expected = _expected(expression, what)
    assert [value if ok else Failed for ok, value in got] == expected
    assert [Failed if type(a) is Failed else a for a in answers] == expected


async def test_light_expressions_start_no_process_and_expensive_ones_do() -> None:
    evaluations = Evaluations(2)
    try:
        assert await evaluations.run("t", "payload.amount > 10", "where", DOCUMENTS) == [True, False, False]
        assert evaluations.pool.started == 0
        assert await evaluations.run("t", "payload.amount > 10 and $contains(payload.s, /b/)", "where",
                                     DOCUMENTS) == [True, False, False]
        assert evaluations.pool.started >= 1
    finally:
        await evaluations.close()


async def test_stop_at_error_answers_through_the_first_failure() -> None:
    evaluations = Evaluations(2)
    documents = [{"v": "1"}, {"v": "x"}, {"v": "2"}]
    try:
        for expression in ("$number(v) > 0", "$number(v) > 0 and $contains(v, /./)"):
            answers = await evaluations.run("t", expression, "where", documents, stop_at_error=True)
            assert answers[0] is True and type(answers[1]) is Failed and len(answers) == 2
    finally:
        await evaluations.close()


async def test_select_raises_filter_failed_with_the_evaluations_message() -> None:
    from yoke.events import Event

    events = [Event(offset=1, id="e1", at=0, type="s", payload=HOSTILE["payload"])]
    evaluations = Evaluations(2)
    try:
        with pytest.raises(errors.InvalidFilter) as info:
            await evaluations.select("t", Filter(where=BACKTRACKS), events)
    finally:
        await evaluations.close()
    assert info.value.code == "filter_failed" and "timed out" in info.value.message


async def _loop_lag_while(work: asyncio.Future) -> float:
    """The longest a 1 ms sleep overslept while ``work`` ran."""
    worst = 0.0
    while not work.done():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        worst = max(worst, time.perf_counter() - started - 0.001)
    return worst


async def test_an_expensive_evaluation_leaves_the_event_loop_free() -> None:
    """The backtracking regex of issue 30 runs for its whole second (of CPU)
    in a process; the loop meanwhile keeps its 1 ms timers (it held them
    for the whole second when the match ran on the loop), give or take what
    busy shared cores take."""
    evaluations = Evaluations(2)
    try:
        await evaluations.run("t", "$contains(payload.s, /x/)", "where", [HOSTILE])  # the process started
        work = asyncio.ensure_future(evaluations.run("t", BACKTRACKS, "where", [HOSTILE] * 3, stop_at_error=True))
        lag = await _loop_lag_while(work)
        [answer] = await work
    finally:
        await evaluations.close()
    assert type(answer) is Failed and "timed out" in answer.message
    assert lag < 0.3, f"the loop overslept by {lag * 1000:.0f} ms"  # shared cores: not 0, but not the second


async def test_a_light_expression_found_slow_moves_to_the_processes(monkeypatch) -> None:
    """A path through many items is light by its text; on large events it
    takes milliseconds, and after two slow evaluations in a row it runs in
    the processes (for that tenant), with the same answers."""
    big = {"type": "x", "path": "/", "payload": {"items": [{"n": i, "m": [i, i]} for i in range(2_000)]}}
    expression = "payload.items[n > 1998].n = 1999"
    assert not expensive(expression)
    evaluations = Evaluations(2)
    try:
        for _ in range(2):  # cut off on the loop, then the rest in a process; twice in a row
            assert await evaluations.run("a", expression, "where", [big, big, big]) == [True, True, True]
        assert not evaluations.on_loop("a", expression) and evaluations.on_loop("b", expression)
        assert evaluations.pool.started >= 1
        assert await evaluations.run("a", expression, "where", [big]) == [True]
        monkeypatch.setattr(evaluation, "SLOW_FOR_S", 0.0)
        evaluations._strike("c", expression)
        evaluations._strike("c", expression)
        assert evaluations.on_loop("c", expression)  # expired: tried on the loop again
    finally:
        await evaluations.close()


async def test_tenants_take_turns() -> None:
    """One tenant with many long evaluations queued holds one of the two
    processes; another tenant's evaluation runs on the other at once."""
    evaluations = Evaluations(2)
    try:
        await evaluations.run("warm", "$contains(payload.s, /x/)", "where", [HOSTILE])
        hostile = [
            asyncio.ensure_future(evaluations.run("a", BACKTRACKS, "where", [HOSTILE], stop_at_error=True))
            for _ in range(6)
        ]
        await asyncio.sleep(0)  # queued
        started = time.perf_counter()
        assert await evaluations.run("b", "$contains(payload.s, /a+b/)", "where", [HOSTILE]) == [True]
        waited = time.perf_counter() - started
        assert not all(task.done() for task in hostile)
        for task in hostile:
            task.cancel()
    finally:
        await evaluations.close()
    assert waited < 0.5, f"tenant b waited {waited:.2f} s behind tenant a"


async def test_a_process_past_its_deadline_is_replaced(monkeypatch) -> None:
    monkeypatch.setattr(pool, "DEADLINE_S", 0.2)  # of CPU, checked every CHECK_S
    monkeypatch.setattr(pool, "CHECK_S", 0.05)
    evaluations = Evaluations(1)
    try:
        [answer] = await evaluations.run("t", BACKTRACKS, "where", [HOSTILE])
        assert type(answer) is Failed and "did not end within" in answer.message
        assert await evaluations.run("t", "$contains(payload.s, /b$/)", "where", [HOSTILE]) == [True]
        assert evaluations.pool.started == 2
    finally:
        await evaluations.close()


async def test_a_closed_pool_fails_what_waits() -> None:
    evaluations = Evaluations(1)
    waiting = [asyncio.ensure_future(evaluations.run("t", BACKTRACKS, "where", [HOSTILE])) for _ in range(3)]
    await asyncio.sleep(0)
    await evaluations.close()
    for task in waiting:
        with pytest.raises((errors.RuntimeClosed, asyncio.CancelledError)):
            await task


async def test_a_process_that_died_idle_fails_no_evaluation() -> None:
    evaluations = Evaluations(1)
    try:
        await evaluations.run("t", "$contains(payload.s, /b$/)", "where", [HOSTILE])
        [process] = evaluations.pool._processes
        process.proc.kill()
        await process.proc.wait()
        assert await evaluations.run("t", "$contains(payload.s, /b$/)", "where", [HOSTILE]) == [True]
        assert evaluations.pool.started == 2
    finally:
        await evaluations.close()
