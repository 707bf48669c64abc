"""The host protocol: JSON-RPC 2.0 messages, one JSON text per line, on a
unix socket between the kernel and one host process (docs/advanced/hosts.md).

Both sides send requests and answer the other's. The kernel calls
``host.init`` once, then ``actor.process`` per run; the host calls ops by
their names (ops.py) with their JSON params, naming the run in a ``run``
member next to ``params``. Ids are per direction: an answer (``result`` or
``error``) goes to whoever sent the request with that id.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .. import errors

PROTOCOL_VERSION = 1

# Messages longer than this are refused (a host gets 64 KiB events, state
# documents and SQL results of its instance, plus slack).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# JSON-RPC error codes: the standard ones, and ours (-32000 to -32099).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
OP_FAILED = -32000  # an op refused or failed: data.code is the Yoke error code
HANDLER_FAILED = -32001  # the user's handler raised: data.type, data.traceback
OUT_OF_MEMORY = -32002  # the handler hit the memory limit; the host exits after answering
VERSION_MISMATCH = -32003  # host.init named a protocol version the host does not speak
RUN_OVER = -32004  # an op named a run that is not in progress on this host
APP_FAILED = -32005  # the host could not load the application

# What a handler prints (console.log, print, logging) goes to the kernel as
# a notification (no id, no answer): {"method": "run.output", "params":
# {"run": 17 | null, "stream": "stdout" | "stderr", "text": "..."}}. The
# kernel logs it with the run's actor, instance and attempt, and keeps the
# newest OUTPUT_KEPT_CHARS of a run's to record with its failure.
RUN_OUTPUT = "run.output"
OUTPUT_MESSAGE_CHARS = 4096  # of one notification's text (the rest is cut)
OUTPUT_KEPT_CHARS = 8192  # of a run's output, kept with its failure (its traceback is cut at 16 KiB)


def error_by_code() -> dict[str, type[errors.YokeError]]:
    """Yoke error classes by code, so a handler catches the same class it
    would in-process (a subclass sharing its parent's code loses to the parent)."""
    found: dict[str, type[errors.YokeError]] = {}
    todo: list[type[errors.YokeError]] = [errors.YokeError]
    while todo:
        cls = todo.pop(0)
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


def yoke_error(message: str, data: Any) -> errors.YokeError:
    """The Yoke error an answer's ``data`` ({code, details}) names."""
    data = data if isinstance(data, dict) else {}
    cls = error_by_code().get(str(data.get("code")), errors.YokeError)
    try:
        return cls(message, **(data.get("details") or {}))
    except TypeError:
        return cls(message)


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


# A host that ran out of memory exits with this status (when it could not
# even answer OUT_OF_MEMORY).
EXIT_OUT_OF_MEMORY = 3


class Outbox:
    """Messages written in one ``write`` per event-loop turn: answers and
    requests made in the same turn share a system call and a wake-up of
    the other side."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self._pending: list[bytes] = []

    def send(self, message: dict[str, Any]) -> None:
        if not self._pending:
            import asyncio

            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(encode(message))

    def flush(self) -> None:
        if self._pending:
            data, self._pending = b"".join(self._pending), []
            if not self._writer.is_closing():
                self._writer.write(data)


def encode(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        # JSON.stringify writes a string's lone surrogate as an escape that
        # orjson refuses: read it (the op is then refused as not JSON, with
        # a YokeError) rather than take the host for broken.
        message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message is a JSON object")
    return message


def request(id_: int | str, method: str, params: Any, run: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}
    if run is not None:
        message["run"] = run
    return message


def result(id_: int | str, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def error(id_: int | str | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": body}


# SQLite values crossing the seam (ctx.sqlite params and results, in both
# directions, docs/advanced/hosts.md): JSON scalars as they are, except what
# JSON (or JavaScript's numbers) cannot carry exactly: a BLOB is
# {"$blob": base64}, an integer beyond +-(2**53 - 1) {"$int": "decimal"}, an
# infinite real {"$real": "Infinity" | "-Infinity"} (the Node SDK also sends a
# whole number beyond 2**53 so, {"$real": "1e+300"}: it is a double, not an
# integer). SQLite values are scalars, so a one-member object among them is
# always such a tag.
MAX_EXACT_INT = 2**53 - 1


def sql_to_wire(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$blob": base64.b64encode(value).decode()}
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
        return {"$int": str(value)}
    if isinstance(value, float) and math.isinf(value):
        return {"$real": "Infinity" if value > 0 else "-Infinity"}
    return value


def sql_from_wire(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        [(tag, text)] = value.items()
        try:
            if tag == "$blob" and isinstance(text, str):
                return base64.b64decode(text, validate=True)
            if tag == "$int" and isinstance(text, str) and text.lstrip("-").isdigit():
                return int(text)
            if tag == "$real" and isinstance(text, str) and text.lower() not in ("nan", "-nan", "+nan"):
                return float(text)
        except (binascii.Error, ValueError):
            pass
    raise errors.InvalidInput(
        'a SQLite value is a JSON scalar, {"$blob": base64}, {"$int": "digits"} or {"$real": "a number"}',
        field="params",
    )


def sql_params_from_wire(params: Any) -> Any:
    """``ctx.sqlite`` params as SQLite takes them (a sequence or a mapping)."""
    if isinstance(params, dict):
        return {k: sql_from_wire(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [sql_from_wire(v) for v in params]
    return params


def sql_params_to_wire(params: Any) -> Any:
    if isinstance(params, Mapping):
        return {k: sql_to_wire(v) for k, v in params.items()}
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes)):
        return [sql_to_wire(v) for v in params]
    return params


def sql_rows_to_wire(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: sql_to_wire(v) for k, v in row.items()} for row in rows]


def sql_rows_from_wire(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: sql_from_wire(v) for k, v in row.items()} for row in rows]
