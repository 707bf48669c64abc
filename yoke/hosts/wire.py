"""The host protocol: JSON-RPC 2.0 messages, one JSON text per line, on a
unix socket between the kernel and one host process (docs/advanced/hosts.md).

Both sides send requests and answer the other's. The kernel calls
``host.init`` once, then ``actor.process`` per run; the host calls ops by
their names (ops.py) with their JSON params, naming the run in a ``run``
member next to ``params``. Ids are per direction: an answer (``result`` or
``error``) goes to whoever sent the request with that id.
"""

from __future__ import annotations

from typing import Any

import orjson

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
    message = orjson.loads(line)
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
