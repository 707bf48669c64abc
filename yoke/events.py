"""The event envelope: validation of appended input, and the stored shape.

``prepare`` turns one caller dict into a ``PreparedEvent`` (validated, with its
JSON parts serialized once, an id and a fingerprint for idempotency). The
store persists prepared events and hands back ``Event`` objects on read.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import operator
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import errors

MAX_EVENT_BYTES = 64 * 1024
MAX_KEY_CHARS = 256
MAX_TYPE_CHARS = 256
RESERVED_TYPE_PREFIX = "yoke."
# Idempotency keys the kernel derives (object records, copies, schedule
# firings): a user key with these prefixes could squat on them.
RESERVED_KEY_PREFIXES = ("object:", "yoke:")

# Event types: letters, digits and . _ - : / @ + (so "order.placed" and
# "events.example.com/github/webhook-received" both work); '*' is kept for
# filter patterns.
TYPE_RE = re.compile(r"[A-Za-z0-9._:/@+\-]{1,256}")
PATH_SEGMENT_RE = re.compile(r"[A-Za-z0-9._~:@\-]+")
TENANT_RE = re.compile(r"[A-Za-z0-9._\-]{1,64}")
MAX_PATH_CHARS = 512

INPUT_KEYS = frozenset(
    {
        "type",
        "payload",
        "metadata",
        "source",
        "correlation",
        "priority",
        "group_id",
        "idempotency_key",
        "ephemeral",
    }
)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)


# The ids' own generator (seeded from the OS, again in a forked child):
# application code seeding the random module cannot make ids repeat.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def random_bits(n: int) -> int:
    """``n`` random bits for ids that must be unique, not secret: a fast
    PRNG rather than a system call each."""
    return _ids.getrandbits(n)


def _id_ms() -> int:
    """The real clock's ms, for ids only (not the runtime's ``Clock``): an id
    is made wherever an event is prepared, with no component to take a
    clock from, and its time prefix only keeps ids of one process roughly
    in creation order for the indexes. Nothing reads a time back from an
    id; the stored times (created_at...) come from the runtime's clock."""
    return time.time_ns() // 1_000_000


def new_event_id() -> str:
    """A 32-hex-char id that sorts by creation time (48-bit ms + 80 random
    bits). Ids are unique, not secret: a fast PRNG avoids a syscall per event."""
    return f"{_id_ms():012x}{random_bits(80):020x}"


def new_event_ids(n: int) -> list[str]:
    """``n`` ids as new_event_id makes them, drawn at once (a batch's)."""
    if n <= 0:
        return []
    prefix = f"{_id_ms():012x}"
    # 10 random bytes an id, as hex in groups of 20 digits split by ":"
    # (C speed; slicing them out one by one took twice as long).
    return (prefix + _ids.randbytes(10 * n).hex(":", -10).replace(":", ":" + prefix)).split(":")


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise errors.InvalidTenant(f"invalid tenant {tenant!r}", tenant=str(tenant)[:80])
    return tenant


MIN_INT, MAX_INT = -(2**63), 2**63 - 1  # signed 64-bit: the integers both stores hold
MAX_OFFSET = MAX_INT
# A number a caller writes as text (an offset, a cursor): ASCII digits (\d
# takes any script's, and int() reads them), few enough that int() never
# meets its 4,300-digit limit.
DIGITS_RE = re.compile(r"[0-9]{1,19}")


def check_int(value: Any, name: str, low: int = MIN_INT, high: int = MAX_INT, what: str = "an integer") -> int:
    """An integer a caller sent (a cursor, a time, a limit, an id) inside
    [low, high]: by default the signed 64-bit range both stores hold, so
    that no value outside it reaches a driver (SQLite raises OverflowError,
    PostgreSQL DataError: a 500 instead of the caller's mistake)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.InvalidInput(f"{name} must be {what} in [{_bound(low)}, {_bound(high)}]", field=name)
    return value


def _bound(n: int) -> str:
    return {MIN_INT: "-2^63", MAX_INT: "2^63-1"}.get(n, str(n))


def check_offset(value: Any, name: str) -> int:
    """An offset or cursor given by a caller: an integer in [0, 2^63)."""
    return check_int(value, name, 0, MAX_OFFSET)


def validate_path(path: str) -> str:
    """A stream path: '/' or '/seg/seg' with no empty segment and no '.', '..' or '-'."""
    if not isinstance(path, str) or not path.startswith("/") or len(path) > MAX_PATH_CHARS:
        raise errors.InvalidPath(f"invalid stream path {str(path)[:80]!r}", path=str(path)[:80])
    if path == "/":
        return path
    for segment in path[1:].split("/"):
        # '-' alone is the HTTP API's separator between a path and an action.
        if not PATH_SEGMENT_RE.fullmatch(segment) or segment in (".", "..", "-"):
            raise errors.InvalidPath(f"invalid stream path {path[:80]!r}", path=path[:80])
    return path


@dataclass(frozen=True, slots=True)
class AppendResult:
    offset: int
    id: str
    at: int | None = None  # when it was committed (the original time for a repeat)
    # An idempotent repeat: the events were there, nothing was appended.
    duplicate: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class Event:
    offset: int
    id: str
    at: int
    type: str
    payload: Any = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] | None = None
    correlation: str | None = None
    priority: int = 0
    group_id: str | None = None
    idempotency_key: str | None = None
    tenant: str = "default"
    path: str = "/"
    ephemeral: bool = False
    # The bytes of a message appended to a Durable Streams byte stream (its
    # type is BYTES_TYPE, its payload null); None for every other event.
    data: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "offset": self.offset,
            "id": self.id,
            "at": self.at,
            "type": self.type,
            "payload": self.payload,
            "metadata": self.metadata,
            "source": self.source,
            "correlation": self.correlation,
            "priority": self.priority,
            "group_id": self.group_id,
            "idempotency_key": self.idempotency_key,
            "tenant": self.tenant,
            "path": self.path,
            "ephemeral": self.ephemeral,
        }
        if self.data is not None:
            out["data_base64"] = base64.b64encode(self.data).decode()
        return out


@dataclass(slots=True)
class PreparedEvent:
    """A validated event, serialized once, waiting for its offset."""

    id: str
    type: str
    payload_json: str
    metadata_json: str
    source_json: str | None
    correlation: str | None
    priority: int
    group_id: str | None
    idempotency_key: str | None
    ephemeral: bool
    fingerprint: str | None  # only events with an idempotency key need one
    size: int
    object_id: str | None = None  # kernel only: the record commits this object
    data: bytes | None = None  # a byte stream's message (Event.data)

    def to_event(self, tenant: str, path: str, offset: int, at: int) -> Event:
        return Event(
            offset=offset,
            id=self.id,
            at=at,
            type=self.type,
            payload=orjson.loads(self.payload_json),
            metadata=orjson.loads(self.metadata_json),
            source=orjson.loads(self.source_json) if self.source_json else None,
            correlation=self.correlation,
            priority=self.priority,
            group_id=self.group_id,
            idempotency_key=self.idempotency_key,
            tenant=tenant,
            path=path,
            ephemeral=self.ephemeral,
            data=self.data,
        )


# A batch's fields at C speed (map over the batch rather than a Python loop
# a field: batches of hundreds of events pass several such checks).
_ephemeral_of = operator.attrgetter("ephemeral")
_key_of = operator.attrgetter("idempotency_key")
_object_of = operator.attrgetter("object_id")
_is_set = functools.partial(operator.is_not, None)
size_of = operator.attrgetter("size")


def any_ephemeral(events: Sequence[PreparedEvent]) -> bool:
    return any(map(_ephemeral_of, events))


def idempotency_keys(events: Sequence[PreparedEvent]) -> list[str]:
    """The batch's idempotency keys, in order."""
    return list(filter(_is_set, map(_key_of, events)))


def any_object(events: Sequence[PreparedEvent]) -> bool:
    return any(map(_is_set, map(_object_of, events)))


def total_size(events: Sequence[PreparedEvent]) -> int:
    return sum(map(size_of, events))


# JSON text holding a NUL character (an unescaped backslash, then u0000):
# PostgreSQL's json functions cannot handle it, so neither backend accepts it.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

# The value domain: what both backends store and give back unchanged
# (integers: MIN_INT..MAX_INT, above).
MAX_DEPTH = 64  # levels of arrays and objects inside one document
# Datetimes would come back as strings and dataclasses as dicts (with no
# look inside them for NaN): refused rather than converted. STRICT_INTEGER
# makes orjson refuse integers beyond 2^53, so the rare document holding
# one is checked against the signed 64-bit range.
_DUMPS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_DUMPS_STRICT = _DUMPS | orjson.OPT_STRICT_INTEGER


def _orjson_depth() -> int:
    """How deep orjson serializes before 'Recursion limit reached' (254 in
    orjson 3.x), found rather than assumed."""
    value: Any = 1
    for depth in range(1, 2000):
        value = [value]
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return depth - 1
    return depth


# Wrapped in this many lists, a document serializes only if it nests at
# most MAX_DEPTH deep: the depth check runs at orjson's speed.
_ORJSON_DEPTH = _orjson_depth()
_DEPTH_PADDING = _ORJSON_DEPTH - MAX_DEPTH


def check_text(value: str, field: str, error: type[errors.InvalidInput] = errors.InvalidEvent) -> str:
    """Text both backends store faithfully: valid UTF-8 and no NUL."""
    if "\x00" in value:
        raise error(f"{field} must not contain NUL characters", field=field)
    try:
        value.encode()
    except UnicodeEncodeError:
        raise error(f"{field} must be valid Unicode text", field=field) from None
    return value


def utf8_len(value: str) -> int:
    return len(value) if value.isascii() else len(value.encode())


def json_text(value: Any, what: str, *, depth: int = MAX_DEPTH) -> str:
    """Canonical JSON for a stored document (stream metadata, instance config,
    actor state, op params), refusing what either backend cannot store
    faithfully with InvalidInput naming the field."""
    return json_bytes(value, what, depth=depth).decode()


def json_bytes(value: Any, what: str, *, depth: int = MAX_DEPTH) -> bytes:
    """json_text's UTF-8. ``depth``: the nesting allowed, for a document
    that wraps values checked again on their own (an actor op's params)."""
    try:
        return _dumps(value, what, depth)
    except errors.InvalidEvent as exc:
        raise errors.InvalidInput(exc.message, field=exc.details.get("field", what)) from None


def _dumps(value: Any, what: str, depth: int = MAX_DEPTH) -> bytes:
    """Canonical JSON (UTF-8) of a value inside the domain, or InvalidEvent
    naming the offending field. Sorted keys: one text per value, so the
    idempotency fingerprint does not depend on the caller's key order.

    The checks are C-speed scans of the text; the Python walk (check_value)
    runs only when one of them finds a suspect: an integer beyond 2^53, a
    null that did not read back as written (orjson writes NaN and infinities
    as null), or more brackets than MAX_DEPTH."""
    try:
        text = orjson.dumps(value, option=_DUMPS_STRICT)
    except (TypeError, orjson.JSONEncodeError):
        check_value(value, what, depth)  # names the field when it is ours to name
        try:
            text = orjson.dumps(value, option=_DUMPS)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise errors.InvalidEvent(f"{what} is not JSON-serializable: {exc}", field=what) from None
    else:
        if (b"null" in text and orjson.loads(text) != value) or (
            len(text) > 2 * depth
            and text.count(b"[") + text.count(b"{") > depth
            and _deeper_than(value, depth)
        ):
            check_value(value, what, depth)
    if b"\\u0000" in text and _JSON_NUL.search(text):
        raise errors.InvalidEvent(f"{what} must not contain NUL characters", field=what)
    return text


def json_texts(values: list[Any], what: str, *, finite: bool = False) -> list[str]:
    """json_text of each value, checked in one pass over all of them: when
    nothing in the whole list is suspect, each value's text is a plain
    dump. Otherwise each goes through json_text, whose error names it.
    ``finite``: orjson read the values from JSON text, which cannot hold NaN
    or an infinity, so a null in the dump is a null (its scan is skipped)."""
    padded: Any = values
    for _ in range(_DEPTH_PADDING - 1):  # the list is one level: its values may nest MAX_DEPTH
        padded = [padded]
    try:
        whole = orjson.dumps(padded, option=_DUMPS_STRICT)
    except (TypeError, orjson.JSONEncodeError):
        whole = None
    if (
        whole is None
        or (not finite and b"null" in whole and orjson.loads(whole) != padded)
        or (b"\\" in whole and b"\\u0000" in whole)  # a backslash is found at memchr's speed
    ):
        return [json_text(v, what) for v in values]
    return [orjson.dumps(v, option=_DUMPS_STRICT).decode() for v in values]


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether a serializable value nests arrays and objects deeper than
    ``limit``: orjson refuses it inside enough lists to reach its own limit."""
    padding = _ORJSON_DEPTH - limit
    if padding <= 0:
        return True  # let check_value decide
    for _ in range(padding):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def check_value(value: Any, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise InvalidEvent naming the first field outside the domain: a float
    that is NaN or infinite, an integer outside signed 64 bits, nesting
    deeper than ``max_depth`` (MAX_DEPTH)."""
    stack: list[tuple[Any, str, int]] = [(value, what, 0)]
    while stack:
        item, where, depth = stack.pop()
        where = where if len(where) <= 200 else where[:197] + "..."
        if isinstance(item, float):
            if item != item or item in (math.inf, -math.inf):
                raise errors.InvalidEvent(
                    f"{where} is {item}: NaN and infinities are not JSON numbers", field=where
                )
        elif isinstance(item, int) and not isinstance(item, bool):
            if not MIN_INT <= item <= MAX_INT:
                raise errors.InvalidEvent(
                    f"{where} is outside the signed 64-bit integer range [-2^63, 2^63-1]", field=where
                )
        elif isinstance(item, (dict, list, tuple, Mapping)):
            if depth >= max_depth:
                raise errors.InvalidEvent(
                    f"{where} nests deeper than {max_depth} levels of arrays and objects", field=where
                )
            if isinstance(item, (list, tuple)):
                stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
            else:
                stack.extend((v, f"{where}.{k}", depth + 1) for k, v in item.items())


def _optional_str(raw: Mapping[str, Any], key: str, max_chars: int = MAX_KEY_CHARS) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars:
        raise errors.InvalidEvent(f"{key} must be a string of 1-{max_chars} characters", field=key)
    return check_text(value, key)


def prepare(
    raw: Any, *, trusted: bool = False, kernel_key: bool = False, max_event_bytes: int = MAX_EVENT_BYTES
) -> PreparedEvent:
    """Validate one appended event. ``trusted`` is for kernel appends only;
    ``kernel_key`` lets a kernel-derived idempotency key through on an
    otherwise untrusted event (an object record, a schedule firing)."""
    if not isinstance(raw, dict) and not isinstance(raw, Mapping):
        raise errors.InvalidEvent("an event must be a JSON object")
    if not INPUT_KEYS.issuperset(raw):
        unknown = set(raw) - INPUT_KEYS
        raise errors.UnknownEventField(
            f"unknown event field(s): {', '.join(sorted(map(str, unknown)))}",
            fields=sorted(map(str, unknown)),
        )

    event_type = raw.get("type")
    if not isinstance(event_type, str) or not TYPE_RE.fullmatch(event_type):
        raise errors.InvalidEventType(
            "type must be 1-256 characters of letters, digits and . _ - : / @ +"
        )
    if event_type.startswith(RESERVED_TYPE_PREFIX) and not trusted:
        raise errors.ReservedEventType(
            f"event types starting with {RESERVED_TYPE_PREFIX!r} are reserved", type=event_type
        )

    metadata = raw.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) and not isinstance(metadata, Mapping):
        raise errors.InvalidEvent("metadata must be an object", field="metadata")
    source = raw.get("source")
    if source is not None and not isinstance(source, Mapping):
        raise errors.InvalidEvent("source must be an object", field="source")
    if source is not None and "copied_from" in source and not trusted:
        raise errors.ForgedSource("source.copied_from is set by the kernel only")

    priority = raw.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise errors.InvalidEvent("priority must be an integer", field="priority")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise errors.InvalidEvent("priority must fit in 32 bits", field="priority")

    ephemeral = raw.get("ephemeral", False)
    if ephemeral is None:
        ephemeral = False
    if not isinstance(ephemeral, bool):
        raise errors.InvalidEvent("ephemeral must be a boolean", field="ephemeral")

    key = raw.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS):
        raise errors.InvalidIdempotencyKey()
    if key is not None:
        try:
            check_text(key, "idempotency_key")
        except errors.InvalidEvent:
            raise errors.InvalidIdempotencyKey("idempotency_key must be valid text without NUL") from None
        if key.startswith(RESERVED_KEY_PREFIXES) and not (trusted or kernel_key):
            raise errors.ReservedIdempotencyKey(
                f"idempotency keys starting with {' or '.join(map(repr, RESERVED_KEY_PREFIXES))}"
                " are reserved for the kernel",
                field="idempotency_key",
            )
    if ephemeral and key is not None:
        raise errors.EphemeralWithIdempotencyKey()

    correlation = _optional_str(raw, "correlation")
    group_id = _optional_str(raw, "group_id")
    payload_bytes = _dumps(raw.get("payload", {}), "payload")
    metadata_bytes = _dumps(metadata, "metadata")
    source_bytes = _dumps(source, "source") if source is not None else None

    # UTF-8 bytes, as stored: the cap, producer credit and buffers count these.
    size = (
        len(event_type)  # ASCII by TYPE_RE
        + len(payload_bytes)
        + len(metadata_bytes)
        + len(source_bytes or b"")
        + (utf8_len(correlation) if correlation else 0)
        + (utf8_len(group_id) if group_id else 0)
        + (utf8_len(key) if key else 0)
        + 64  # the envelope's own keys and numbers
    )
    if size > max_event_bytes:
        raise errors.EventTooLarge(
            f"event is {size} bytes serialized; the limit is {max_event_bytes}",
            size=size,
            limit=max_event_bytes,
        )

    payload_json = payload_bytes.decode()
    metadata_json = metadata_bytes.decode()
    source_json = source_bytes.decode() if source_bytes is not None else None
    # The fingerprint decides "same event" for idempotency: every caller-set
    # field except the key itself and the ephemeral flag.
    fingerprint = None if key is None else hashlib.blake2b(
        "\x1f".join(
            (
                event_type,
                payload_json,
                metadata_json,
                source_json or "",
                correlation or "",
                str(priority),
                group_id or "",
            )
        ).encode(),
        digest_size=16,
    ).hexdigest()

    return PreparedEvent(
        id=new_event_id(),
        type=event_type,
        payload_json=payload_json,
        metadata_json=metadata_json,
        source_json=source_json,
        correlation=correlation,
        priority=priority,
        group_id=group_id,
        idempotency_key=key,
        ephemeral=ephemeral,
        fingerprint=fingerprint,
        size=size,
    )
