"""JSONata regexes in filters (routing/filters.py) run on the ``regex``
package with a time bound per match: they answer as the standard library's
engine did, one that backtracks catastrophically fails the filter instead
of holding the event loop, and one that would compile into too much memory
is refused when the filter is made."""

from __future__ import annotations

import jsonata
import pytest

from yoke import errors
from yoke.routing import filters

DOCUMENT = {"t": "Hello World foo-bar", "n": "ab12cd", "lines": "one\ntwo\nThree", "u": "ünïcode Straße"}
EXPRESSIONS = [
    "$match(t, /o/)",
    "$match(t, /(\\w)o/, 2)",
    "$contains(t, /WORLD/i)",
    "$contains(t, /^world/)",
    '$replace(t, /o/, "0")',
    '$replace(t, /(\\w+) (\\w+)/, "$2 $1")',
    '$replace(t, /o/, function($m) { $uppercase($m.match) })',
    "$split(n, /[0-9]/)",
    "$split(t, /\\s+/, 1)",
    "/[a-z]+/(n).match",
    "$match(lines, /^t\\w+$/im).match",
    "$match(u, /\\w+/).match",
    "$match(u, /STRASSE/i)",
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_regexes_answer_as_the_standard_engine_did(expression: str) -> None:
    assert filters.evaluate(expression, DOCUMENT) == jsonata.Jsonata(expression).evaluate(DOCUMENT)


def test_a_backtracking_regex_fails_the_filter_instead_of_running_on() -> None:
    """(a|aa)+$ on 60 a's and a b takes the standard engine on the order of
    2^60 steps; here the match is cut off after the evaluation bound."""
    document = {"s": "a" * 60 + "b"}
    with pytest.raises(filters.FilterError, match="timed out"):
        filters.where_true("$count($match(s, /(a|aa)+$/)) > 0", document)
    assert filters.where_true("$count($match(s, /a+b$/)) > 0", document)


@pytest.mark.parametrize("pattern", [
    "((a{1000}){1000}){1000}",  # the regex package writes counted repeats out: this never finished compiling
    "(a{100}){100}",
    "a{1001}",
    "(x|y{600}){2}",
])
def test_regexes_that_would_grow_too_large_are_refused_when_the_filter_is_made(pattern: str) -> None:
    with pytest.raises(errors.InvalidFilter, match="written out"):
        filters.compile_jsonata(f"$match(s, /{pattern}/)")


def test_the_size_bound_counts_every_regex_of_an_expression() -> None:
    filters.compile_jsonata("$match(s, /a{600}/) or $match(s, /b{400}/)")
    with pytest.raises(errors.InvalidFilter, match="written out"):
        filters.compile_jsonata("$match(s, /a{600}/) or $match(s, /b{401}/)")
    # the regexes $eval parses while the expression runs: each on its own, every time
    for _ in range(3):
        assert filters.evaluate('$eval("$count($match(s, /a{900}/))")', {"s": "a" * 1000}) == 1


@pytest.mark.parametrize("pattern", [r"\d{4}-\d{2}-\d{2}", r"[a-f0-9]{32}", r"(\w{3}-){4}", r"(?=x)\w+", r"(a)\1"])
def test_ordinary_regexes_are_taken(pattern: str) -> None:
    filters.compile_jsonata(f"$match(s, /{pattern}/)")


def test_the_language_is_the_standard_engines() -> None:
    """What the standard engine refused stays refused (the regex package's
    extensions, such as Unicode properties, are not filters' language)."""
    with pytest.raises(errors.InvalidFilter, match="bad escape"):
        filters.compile_jsonata(r"$match(s, /\p{L}/)")
