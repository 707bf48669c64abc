"""Filters: which events an actor instance (or a tail) receives.

A filter has ``types`` (exact names, ``prefix.*``, or ``*`` for all),
optional ``streams`` (path globs: ``*`` matches within one path segment,
``**`` across segments) and an optional JSONata ``where`` that must evaluate
to exactly ``true`` on the event. Keyed routing adds ``key``, a JSONata
expression whose value names the instance an event goes to.

Expressions are compiled once (``compile_jsonata`` caches by text) and
rejected with the parser's message when they do not parse.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from re import _parser as re_parser  # the standard engine's parser: see _bounded_regex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonata
import regex
from jsonata.jexception import JException
from jsonata.regex_engine import RegexFlags

from .. import errors

TYPE_PATTERN = re.compile(r"\*|[A-Za-z0-9._:/@+\-]{1,256}(\.\*)?")


class _BoundedPattern:
    """A JSONata regex (``/.../`` in an expression) compiled by the ``regex``
    package, each match cut off after EVALUATION_TIMEOUT_MS (TimeoutError):
    the runtime bound below is checked between evaluation steps, and one
    catastrophically backtracking match (``$match(s, /(a|aa)+$/)``) is a
    single step that held the event loop for longer than any request may
    wait. ``regex`` is compatible with ``re`` (its version 0 mode) and
    avoids much of the backtracking besides. The methods are the ones
    jsonata calls (jsonata.regex_engine.CompiledPattern)."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: regex.Pattern[str]) -> None:
        self._pattern = pattern

    def search(self, string: str) -> Any:
        return self._pattern.search(string, timeout=_REGEX_TIMEOUT_S)

    def finditer(self, string: str) -> Any:
        return self._pattern.finditer(string, timeout=_REGEX_TIMEOUT_S)

    def sub(self, repl: Any, string: str, count: int = 0) -> str:
        return self._pattern.sub(repl, string, count=count, timeout=_REGEX_TIMEOUT_S)

    def split(self, string: str, maxsplit: int = 0) -> list[str]:
        return self._pattern.split(string, maxsplit=maxsplit, timeout=_REGEX_TIMEOUT_S)


# How large the regexes of one expression may grow with their counted
# repeats written out (``(\w{3}-){4}`` is 16): ``regex`` compiles them
# written out, about 120 bytes each (``((a{1000}){1000}){1000}`` never
# finished compiling), where a filter's needs are tens
# (``\d{4}-\d{2}-\d{2}``: 8).
MAX_REGEX_SIZE = 1000
_REPEATS = {re_parser.MAX_REPEAT, re_parser.MIN_REPEAT, re_parser.POSSESSIVE_REPEAT}


def _written_out(items: re_parser.SubPattern) -> int:
    size = 0
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            size += max(low if high == re_parser.MAXREPEAT else high, 1) * _written_out(sub)
        elif op is re_parser.BRANCH:
            size += max(_written_out(branch) for branch in av[1])
        else:
            parts = [x for x in (av if isinstance(av, (tuple, list)) else (av,)) if isinstance(x, re_parser.SubPattern)]
            size += sum(map(_written_out, parts)) if parts else 1
    return size


class _RegexEngine:
    """Compiles an expression's regexes, within MAX_REGEX_SIZE for all of
    them together. Each is parsed by the standard engine first: filters
    take the language they took when ``re`` ran them (none of ``regex``'s
    extensions)."""

    def __init__(self) -> None:
        self.left = MAX_REGEX_SIZE

    def __call__(self, pattern: str, flags: RegexFlags) -> _BoundedPattern:
        re_flags = (re.IGNORECASE if flags.case_insensitive else 0) | (re.MULTILINE if flags.multiline else 0)
        size = _written_out(re_parser.parse(pattern, re_flags))
        if size > self.left:
            raise ValueError(
                f"the regex /{pattern[:60]}/ repeats to {size} items written out, past what is left of"
                f" the expression's {MAX_REGEX_SIZE}"
            )
        self.left -= size
        return _BoundedPattern(regex.compile(pattern, re_flags))


def _runtime_regex(pattern: str, flags: RegexFlags) -> _BoundedPattern:
    """A regex that $eval parses while the expression runs: within the size
    on its own (compiled for that evaluation, not kept)."""
    return _RegexEngine()(pattern, flags)


@lru_cache(maxsize=4096)
def compile_jsonata(expression: str, what: str = "where") -> jsonata.Jsonata:
    """The compiled expression; ``InvalidFilter`` with the parser's message."""
    if not isinstance(expression, str) or not expression.strip():
        raise errors.InvalidFilter(f"{what} must be a non-empty JSONata expression", field=what)
    try:
        compiled = jsonata.Jsonata(expression, _RegexEngine())
        compiled.regex_engine = _runtime_regex  # what $eval hands the expressions it parses
        # Documents are events (JSON by construction): jsonata's check of
        # every value before each evaluation cost 4.6 ms on a 50 KB payload
        # whatever the expression read, and half of a small one's 32 us.
        compiled.validate_input = False
        return compiled
    except Exception as exc:  # the parser raises JException (and a few others)
        raise errors.InvalidFilter(
            f"{what} is not valid JSONata: {exc}", field=what, expression=expression[:200]
        ) from None


# How much CPU time one evaluation may use. Expressions come from callers
# (a tail's where=, a subscription's filter): one that loops forever (a
# self-applied function) would hold an evaluator process (evaluation.py) for
# good, as it once froze the whole server's event loop. A legitimate one
# takes microseconds; the bound is generous (a failed filter skips its
# event). It is CPU time, not wall time: the evaluator processes run at a
# lower priority and wait whenever the server needs the cores, and that
# waiting must not fail an expression. A regex match is one step of the
# evaluation, bounded on its own (_BoundedPattern) by as much again (the
# regex package counts CPU time too).
EVALUATION_TIMEOUT_MS = 1000
_REGEX_TIMEOUT_S = EVALUATION_TIMEOUT_MS / 1000


def evaluate(expression: str, document: Any, what: str = "where", timeout_ms: int = EVALUATION_TIMEOUT_MS) -> Any:
    """The compiled expression's value on ``document``, cut off (JException
    D1012, ``cut_off``) once it has used ``timeout_ms`` of this thread's CPU
    time (checked at every step, as jsonata's own wall-time bound is)."""
    compiled = compile_jsonata(expression, what)
    frame = compiled.create_frame()
    clock = time.thread_time
    deadline = clock() + timeout_ms / 1000

    def check(*_: Any) -> None:
        if clock() > deadline:
            raise JException("D1012", -1, timeout_ms)

    frame.set_evaluate_entry_callback(check)
    frame.set_evaluate_exit_callback(check)
    return compiled.evaluate(document, frame)


def cut_off(exc: BaseException) -> bool:
    """Did ``exc`` end an evaluation at its time bound?"""
    return getattr(exc, "error", None) == "D1012"


def outcome(expression: str, document: Any, what: str, timeout_ms: int = EVALUATION_TIMEOUT_MS) -> Any:
    """What a caller takes from the expression on ``document``: for a
    ``where``, whether it is exactly true; for a ``key``, the key's text
    (None: no key); for a ``transform``, its value. Raises what the
    evaluation raised (``failure`` makes the caller's error of it)."""
    if what == "key":
        return key_of(expression, document, timeout_ms)
    value = evaluate(expression, document, what, timeout_ms)
    return value is True if what == "where" else value


def failure(what: str, message: str, expression: str) -> errors.YokeError:
    """The error of an expression that failed on an event."""
    if what == "transform":
        return errors.InvalidTransform(f"the transform failed on an event: {message}", expression=expression[:200])
    return FilterError(f"the filter failed on an event: {message}", expression=expression[:200])


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


@dataclass(frozen=True, slots=True)
class Equality:
    """A ``where`` that is (or starts with ``... and``) ``a.b.c = literal``:
    the index looks the value up instead of running JSONata on every route.
    ``exact``: the equality is the whole expression."""

    path: tuple[str, ...]
    key: tuple[str, Any]
    exact: bool


UNKNOWN = object()  # the path crosses an array: only JSONata can say


def literal_key(value: Any) -> tuple[str, Any] | None:
    """JSONata's ``=`` on scalars: numbers by value, never equal to booleans."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int) and abs(value) > 2**53:
        return None  # beyond exact floats: left to JSONata
    if isinstance(value, (int, float)):
        return ("n", float(value))
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z", None)
    return None


def lookup(document: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path``: None when missing (JSONata's undefined never
    equals a literal), UNKNOWN when an array is in the way."""
    value = document
    for name in path:
        if isinstance(value, list):
            return UNKNOWN
        if not isinstance(value, dict) or name not in value:
            return _MISSING
        value = value[name]
    if isinstance(value, (list, dict)):
        return UNKNOWN if isinstance(value, list) else _MISSING
    return value


_MISSING = object()
_PLAIN_STEP_ATTRS = ("stages", "predicate", "group", "focus", "index", "tuple", "keep_array")


def _equality_node(node: Any) -> tuple[tuple[str, ...], tuple[str, Any]] | None:
    if getattr(node, "type", None) != "binary" or getattr(node, "value", None) != "=":
        return None
    lhs, rhs = node.lhs, node.rhs
    if getattr(lhs, "type", None) != "path" or getattr(rhs, "type", None) not in ("number", "string", "value"):
        return None
    names = []
    for step in lhs.steps or ():
        if getattr(step, "type", None) != "name" or any(getattr(step, a, None) for a in _PLAIN_STEP_ATTRS):
            return None
        names.append(step.value)
    key = literal_key(rhs.value)
    if not names or key is None:
        return None
    return tuple(names), key


@lru_cache(maxsize=4096)
def equality_of(expression: str) -> Equality | None:
    node = compile_jsonata(expression).ast
    found = _equality_node(node)
    if found is not None:
        return Equality(found[0], found[1], exact=True)
    if getattr(node, "type", None) == "binary" and getattr(node, "value", None) == "and":
        found = _equality_node(node.lhs) or _equality_node(node.rhs)
        if found is not None:
            return Equality(found[0], found[1], exact=False)
    return None


def path_matches(patterns: Iterable[str], path: str) -> bool:
    return any(_glob(p).fullmatch(path) for p in patterns)


@dataclass(frozen=True, slots=True)
class Filter:
    types: tuple[str, ...] = ("*",)
    streams: tuple[str, ...] | None = None
    where: str | None = None
    key: str | None = None

    def __init__(
        self,
        types: Iterable[str] | str = ("*",),
        streams: Iterable[str] | str | None = None,
        where: str | None = None,
        key: str | None = None,
    ) -> None:
        if isinstance(types, str):
            types = (types,)
        if isinstance(streams, str):
            streams = (streams,)
        object.__setattr__(self, "types", tuple(types))
        object.__setattr__(self, "streams", None if streams is None else tuple(streams))
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "key", key)
        self.validate()

    def validate(self) -> None:
        if not self.types or not all(isinstance(t, str) and TYPE_PATTERN.fullmatch(t) for t in self.types):
            raise errors.InvalidFilter(
                "types must be a non-empty list of event types, 'prefix.*' or '*'", field="types"
            )
        if self.streams is not None and not all(
            isinstance(s, str) and s.startswith("/") and len(s) <= 1024 and "\x00" not in s
            for s in self.streams
        ):
            raise errors.InvalidFilter("streams are path globs starting with '/'", field="streams")
        for expression in (self.where, self.key):
            if expression is not None and not isinstance(expression, str):
                raise errors.InvalidFilter("an expression is a JSONata string")
            if expression is not None and "\x00" in expression:
                raise errors.InvalidFilter("an expression must not contain NUL characters")
        if self.where is not None:
            compile_jsonata(self.where, "where")
        if self.key is not None:
            compile_jsonata(self.key, "key")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"types": list(self.types)}
        if self.streams is not None:
            out["streams"] = list(self.streams)
        if self.where is not None:
            out["where"] = self.where
        if self.key is not None:
            out["key"] = self.key
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | Filter) -> Filter:
        if isinstance(raw, Filter):
            return raw
        if not isinstance(raw, Mapping):
            raise errors.InvalidFilter("a filter is an object with types, streams and where")
        unknown = set(raw) - {"types", "streams", "where", "key"}
        if unknown:
            raise errors.InvalidFilter(f"unknown filter field(s): {', '.join(sorted(unknown))}")
        types = raw.get("types", ("*",))
        if isinstance(types, str) or not isinstance(types, Iterable):
            raise errors.InvalidFilter("types must be a list", field="types")
        streams = raw.get("streams")
        if streams is not None and (isinstance(streams, str) or not isinstance(streams, Iterable)):
            raise errors.InvalidFilter("streams must be a list", field="streams")
        return cls(types=types, streams=streams, where=raw.get("where"), key=raw.get("key"))

    def matches_type(self, event_type: str) -> bool:
        for t in self.types:
            if t == "*" or t == event_type or (t.endswith(".*") and event_type.startswith(t[:-1])):
                return True
        return False

    def matches(self, document: Mapping[str, Any]) -> bool:
        """Type, stream and ``where`` against an event document (``Event.to_dict()``).
        Raises ``FilterError`` when ``where`` fails to evaluate."""
        if not self.matches_type(document["type"]):
            return False
        if self.streams is not None and not path_matches(self.streams, document["path"]):
            return False
        return self.where is None or where_true(self.where, document)


class FilterError(errors.InvalidFilter):
    """The filter's expression failed to evaluate on an event."""

    code = "filter_failed"


def where_true(expression: str, document: Any) -> bool:
    try:
        return evaluate(expression, document) is True
    except errors.InvalidFilter:
        raise
    except Exception as exc:
        raise failure("where", str(exc), expression) from None


# A key is most often a plain path (``payload.customer``): walked through
# dicts directly, since a JSONata evaluation costs about 100 times more (it
# validates the whole document first). Anything else (arrays on the way,
# a missing name, a list at the end) is left to JSONata, which decides.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLAIN_PATH = re.compile(rf"{_NAME}(?:\.{_NAME})*")
_LITERALS = frozenset({"true", "false", "null", "and", "or", "in", "function"})
UNDECIDED = object()


@lru_cache(maxsize=4096)
def _plain_path(expression: str) -> tuple[str, ...] | None:
    text = expression.strip()
    if not _PLAIN_PATH.fullmatch(text):
        return None
    names = tuple(text.split("."))
    return None if _LITERALS.intersection(names) else names


def _walk(names: tuple[str, ...], document: Any) -> Any:
    value = document
    for name in names:
        if not isinstance(value, dict) or name not in value:
            return UNDECIDED
        value = value[name]
    return UNDECIDED if isinstance(value, list) else value


def key_of(expression: str, document: Any, timeout_ms: int = EVALUATION_TIMEOUT_MS) -> str | None:
    """The routing key an event carries (None when the expression yields nothing)."""
    value = plain_key(expression, document)
    if value is UNDECIDED:
        return key_text(evaluate(expression, document, "key", timeout_ms))
    return value


def plain_key(expression: str, document: Any) -> Any:
    """The key when the expression is a plain path that walks to it
    through objects; ``UNDECIDED`` when only JSONata can say."""
    names = _plain_path(expression)
    value = UNDECIDED if names is None else _walk(names, document)
    return value if value is UNDECIDED else key_text(value)


def key_text(value: Any) -> str | None:
    """A key expression's value as the key (None: no key)."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
