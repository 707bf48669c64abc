"""JSONata regexes in filters (routing/filters.py) run on the ``regex``
package with a time bound per match: they answer as the standard library's
engine did, and one that backtracks catastrophically fails the filter
instead of holding the event loop."""

from __future__ import annotations

import jsonata
import pytest

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
