"""Which JSONata expressions are expensive: never evaluated on the event loop.

An expression is *light* when every part of it costs at most a pass over
the event: paths, predicates, literals, comparisons, arithmetic, conditions,
object and array constructors, and the built-in functions in
``LIGHT_FUNCTIONS``. Everything else is *expensive*: a regex (one match can
backtrack for its whole time bound), a function definition (it can recurse
until the bound), ``$eval``, ranges (``[1..10000000]``), sorting, joins over
tuple streams (``a@$x.b@$y``: a cross product), variable bindings,
partial application, ``~>`` and transforms, and any other function.

The decision reads the expression only, so a client can tell in advance
which of its tails count as expensive (docs/reference/http.md#expensive-filters). A
light expression can still be slow on a large event (``payload.items.x``
over thousands of items): evaluation.py watches how long each one takes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonata.parser import Parser

from .filters import compile_jsonata

LIGHT_FUNCTIONS = frozenset({
    "string", "length", "substring", "substringBefore", "substringAfter", "uppercase", "lowercase",
    "trim", "contains", "split", "number", "abs", "floor", "ceil", "round", "sqrt", "boolean", "not",
    "exists", "count", "sum", "max", "min", "average", "append", "reverse", "keys", "lookup", "type",
    "now", "millis", "toMillis", "fromMillis", "base64encode", "base64decode", "encodeUrl",
    "encodeUrlComponent", "decodeUrl", "decodeUrlComponent",
})
_EXPENSIVE_NODES = frozenset({"regex", "lambda", "partial", "apply", "transform", "sort", "bind", "index"})


@lru_cache(maxsize=4096)
def expensive(expression: str) -> bool:
    """Is ``expression`` (valid JSONata) expensive?"""
    return _expensive(compile_jsonata(expression).ast, set())


def _expensive(node: Parser.Symbol, seen: set[int]) -> bool:
    if id(node) in seen:
        return False
    seen.add(id(node))
    kind = node.type
    if kind in _EXPENSIVE_NODES or (kind == "binary" and node.value == ".."):
        return True
    if getattr(node, "focus", None) is not None or getattr(node, "tuple", None):
        return True
    if kind == "function":
        procedure = node.procedure
        if getattr(procedure, "type", None) != "variable" or procedure.value not in LIGHT_FUNCTIONS:
            return True
    return any(_expensive(child, seen) for child in _children(node))


def _children(node: Parser.Symbol) -> list[Parser.Symbol]:
    """The nodes ``node`` refers to (operands, steps, arguments, predicates,
    object constructors' pairs), whatever the attribute."""
    out: list[Parser.Symbol] = []
    for name, value in vars(node).items():
        if name != "_outer_instance":
            _collect(value, out)
    return out


def _collect(value: Any, out: list[Parser.Symbol]) -> None:
    if isinstance(value, Parser.Symbol):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, out)
