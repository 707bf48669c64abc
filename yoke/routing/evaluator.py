"""An evaluator process: runs JSONata expressions away from the server's
event loop (pool.py starts and feeds it; evaluation.py decides what comes
here).

    python -m yoke.routing.evaluator FD

FD is its end of a socket pair. Each message either way is a frame: 4 bytes
of length (big-endian), then that many bytes of JSON. The process first
sends an empty frame (it is ready), then answers each job

    {"expression", "what", "documents": [...], "stop_at_error", "slice_ms"}

with ``{"results": [[true, value] | [false, message], ...]}`` for the first
documents: it stops after the first failure when ``stop_at_error``, and once
``slice_ms`` have passed, so that the pool can give other tenants their turn
before sending the rest. Each evaluation is bounded as everywhere
(filters.EVALUATION_TIMEOUT_MS); the pool kills a process that overruns
that anyway (one long step of a built-in function).

The process runs at a lower priority (``NICE``) than the server, so that
when the cores are busy the server's event loop gets them first, and within
``MEMORY_LIMIT_BYTES`` of address space (``[1..10000000]`` asks for
hundreds of MB); it dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import sys
import time
from typing import Any

import orjson

from .filters import outcome

NICE = 10
MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024
HEADER = 4


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(HEADER, "big") + data


def run(job: dict[str, Any]) -> list[list[Any]]:
    expression, what, stop_at_error = job["expression"], job["what"], job["stop_at_error"]
    deadline = time.perf_counter() + job["slice_ms"] / 1000
    results: list[list[Any]] = []
    for document in job["documents"]:
        try:
            results.append([True, outcome(expression, document, what)])
        except MemoryError:
            results.append([False, "the expression needed more memory than an evaluation may take"])
        except Exception as exc:  # noqa: BLE001 - every failure is the expression's, reported as such
            results.append([False, str(exc) or type(exc).__name__])
        if (stop_at_error and not results[-1][0]) or time.perf_counter() >= deadline:
            break
    return results


def answer(results: list[list[Any]]) -> bytes:
    try:
        return orjson.dumps({"results": results})
    except TypeError:  # a value that is not JSON (a function): that result fails
        for result in results:
            try:
                orjson.dumps(result[1])
            except TypeError:
                result[:] = [False, "the expression's value is not JSON"]
        return orjson.dumps({"results": results})


def lower_priority() -> None:
    """Below the server, for the CPU. Where Linux shares the CPU between
    sessions first (autogroups), a process's own priority counts only
    within its session: the server's session would pay for this process's
    CPU, so it takes a session of its own, at a lower priority."""
    try:
        os.setsid()
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(NICE))
    except OSError:
        pass  # no autogroups here: the process's own priority is what counts
    os.nice(NICE)


def _read_exactly(stream: Any, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def main() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        return  # the server is already gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the server decides
    lower_priority()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    connection = socket.socket(fileno=int(sys.argv[1]))
    reader = connection.makefile("rb")
    connection.sendall(frame(b""))
    while True:
        header = _read_exactly(reader, HEADER)
        if header is None:
            return  # the pool closed its end
        body = _read_exactly(reader, int.from_bytes(header, "big"))
        if body is None:
            return
        connection.sendall(frame(answer(run(orjson.loads(body)))))


if __name__ == "__main__":
    main()
