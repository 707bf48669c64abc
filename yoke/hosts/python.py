"""The Python host: ``python -m yoke.hosts.python FD`` with FD one end of a
unix socket pair whose other end the kernel holds (pool.py).

It imports the application ``host.init`` names and runs ``actor.process``
calls; every ctx call becomes an op request on the socket. It holds no
database connection, no credentials (the kernel starts it without YOKE_*
settings) and no reference to the runtime: ``ctx.ops`` here is ``RemoteOps``.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import io
import os
import random
import resource
import signal
import socket
import sys
import time
import traceback
from typing import Any

from . import wire as p


class OpFailed(Exception):
    """An op answered with an error that has no Yoke code."""


class Connection:
    """This host's end of the socket: requests out, answers matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._outbox = p.Outbox(writer)
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._errors = p.error_by_code()

    def send(self, message: dict[str, Any]) -> None:
        self._outbox.send(message)

    async def call(self, run: int, method: str, params: Any) -> Any:
        self._next_id += 1
        id_ = self._next_id
        future = asyncio.get_running_loop().create_future()
        self._waiting[id_] = future
        try:
            self.send(p.request(id_, method, params, run))
            return await future
        finally:
            self._waiting.pop(id_, None)

    def answered(self, message: dict[str, Any]) -> None:
        future = self._waiting.get(message.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(self._exception(message["error"]))
        else:
            future.set_result(message.get("result"))

    def _exception(self, body: dict[str, Any]) -> Exception:
        data = body.get("data") or {}
        cls = self._errors.get(data.get("code", ""))
        if cls is None:
            return OpFailed(body.get("message", "op failed"))
        exc = cls(body.get("message"), **(data.get("details") or {}))
        return exc


class RemoteOps:
    """What ``ctx`` calls: the same surface as the kernel's OpHandler
    (``call``, ``tenant``, ``update_lock``), each call a message."""

    def __init__(self, connection: Connection, run: int, tenant: str, locks: dict[str, asyncio.Lock],
                 instance_id: str, clock: dict[str, Any] | None = None, seed: int | None = None) -> None:
        self._connection = connection
        # The runtime's clock at the run's start; it runs on with this
        # process's unless it stands still (a test's virtual clock).
        clock = clock or {"now": time.time(), "runs": True}
        self._started_at = float(clock["now"])
        self._started = time.monotonic() if clock.get("runs") else None
        self._run = run
        self.tenant = tenant
        self._locks = locks
        self._instance_id = instance_id
        self._seed = seed  # the kernel's, kept with the run's input
        self._rng: random.Random | None = None

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self._connection.call(self._run, method, params)

    def random(self) -> float:
        if self._rng is None:
            self._rng = random.Random(self._seed)
        return self._rng.random()

    def now(self) -> float:
        if self._started is None:
            return self._started_at
        return self._started_at + time.monotonic() - self._started

    def update_lock(self) -> asyncio.Lock:
        """Serializes this host's ctx.state.update calls of one instance
        (other hosts' are caught by the compare-and-set)."""
        return self._locks.setdefault(self._instance_id, asyncio.Lock())


# The run the code running now belongs to (asyncio tasks inherit it): what
# it prints is sent as that run's output (wire.RUN_OUTPUT).
CURRENT_RUN: contextvars.ContextVar[int | None] = contextvars.ContextVar("yoke_run", default=None)


class RunOutputStream(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of a host: each line written goes to
    the kernel as a run.output notification of the run it was written in."""

    def __init__(self, connection: Connection, stream: str) -> None:
        self._connection = connection
        self._stream = stream
        self._pending: dict[int | None, str] = {}
        self._loop = asyncio.get_running_loop()  # a worker thread's print goes through it

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        run = CURRENT_RUN.get()
        pending = self._pending.get(run, "") + text
        head, newline, rest = pending.rpartition("\n")
        if newline:
            self._send(run, head + newline)
        if rest and len(rest) < p.OUTPUT_MESSAGE_CHARS:
            self._pending[run] = rest
        else:
            self._pending.pop(run, None)
            if rest:
                self._send(run, rest)
        return len(text)

    def flush(self) -> None:
        for run, text in list(self._pending.items()):
            self._send(run, text)
        self._pending.clear()

    def end_run(self, run: int) -> None:
        """What the run wrote without a newline, sent now."""
        text = self._pending.pop(run, "")
        if text:
            self._send(run, text)

    def _send(self, run: int | None, text: str) -> None:
        message = p.notification(p.RUN_OUTPUT, {"run": run, "stream": self._stream, "text": text[: p.OUTPUT_MESSAGE_CHARS]})
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # a worker thread (asyncio.to_thread, an executor)
            on_loop = False
        if on_loop:
            self._connection.send(message)
        else:
            self._loop.call_soon_threadsafe(self._connection.send, message)


class Host:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.actors: dict[str, Any] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.memory_limit = 0

    async def handle(self, message: dict[str, Any]) -> None:
        id_, method, params = message.get("id"), message.get("method"), message.get("params") or {}
        try:
            if method == "host.init":
                value = self.init(params)
            elif method == "actor.process":
                value = await self.process(params)
            else:
                self.connection.send(p.error(id_, p.METHOD_NOT_FOUND, f"unknown method {method!r}"))
                return
        except _Refused as exc:
            self.connection.send(p.error(id_, exc.code, exc.message, exc.data))
            return
        except MemoryError as exc:
            # The heap may be full and in any state: free what the handler's
            # frames hold, answer if that still works, end this host either way.
            traceback.clear_frames(exc.__traceback__)
            del exc
            try:
                self.connection.send(p.error(
                    id_, p.OUT_OF_MEMORY,
                    f"MemoryError: the host's memory limit ({self.memory_limit // 2**20} MiB) was reached",
                ))
                self.connection._outbox.flush()
                await self.connection._writer.drain()
            finally:
                os._exit(p.EXIT_OUT_OF_MEMORY)
        except Exception as exc:  # the handler's failure: the kernel retries the row
            self.connection.send(p.error(
                id_, p.HANDLER_FAILED, f"{type(exc).__name__}: {exc}",
                {"type": type(exc).__name__, "traceback": traceback.format_exc()},
            ))
            return
        self.connection.send(p.result(id_, value))

    def init(self, params: dict[str, Any]) -> dict[str, Any]:
        version = params.get("protocol")
        if version != p.PROTOCOL_VERSION:
            raise _Refused(p.VERSION_MISMATCH, f"this host speaks protocol {p.PROTOCOL_VERSION}, not {version}",
                           {"supported": [p.PROTOCOL_VERSION]})
        limit = int(params.get("memory_limit_bytes") or 0)
        if limit > 0:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            self.memory_limit = limit
        for entry in reversed(params.get("sys_path") or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        from ..actors.app import load_app

        try:
            app = load_app(params["app"])
        except Exception as exc:
            raise _Refused(p.APP_FAILED, f"cannot load {params.get('app')}: {type(exc).__name__}: {exc}",
                           {"traceback": traceback.format_exc()}) from None
        self.actors = {name: d.handler for name, d in app.actors.items() if d.handler is not None}
        return {"protocol": p.PROTOCOL_VERSION, "language": "python", "pid": os.getpid(),
                "actors": sorted(self.actors)}

    async def process(self, params: dict[str, Any]) -> None:
        from ..actors.context import Context
        from ..events import Event
        from ..store.actors import InstanceInfo

        handler = self.actors.get(params.get("actor"))  # type: ignore[arg-type]
        if handler is None:
            raise _Refused(p.INVALID_PARAMS, f"no actor named {params.get('actor')!r} in this host")
        instance = InstanceInfo(**params["instance"])
        event = Event(**params["event"])
        ops = RemoteOps(self.connection, params["run"], instance.tenant, self.locks, instance.instance_id,
                        params.get("clock"), params.get("seed"))
        ctx = Context(ops, instance, event, params["attempt"], params.get("queue_row"))  # type: ignore[arg-type]
        token = CURRENT_RUN.set(params["run"])
        # The attempt's trace context, current around the handler: its own
        # spans (with an SDK installed in the app) join the run's trace.
        attached = _attach_trace(params.get("trace"))
        try:
            await handler(ctx, event)
        finally:
            if attached is not None:
                from opentelemetry import context as otel_context

                otel_context.detach(attached)
            CURRENT_RUN.reset(token)
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, RunOutputStream):
                    stream.end_run(params["run"])


def _attach_trace(carrier: Any) -> object | None:
    """Make the W3C context ``carrier`` current (the detach token), if any."""
    if not isinstance(carrier, dict) or not carrier:
        return None
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return otel_context.attach(TraceContextTextMapPropagator().extract(carrier))


class _Refused(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def die_with_parent() -> None:
    """SIGKILL this host when the kernel's process ends (Linux), so a host
    stuck in a loop does not outlive it (otherwise EOF on the socket ends it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=p.MAX_MESSAGE_BYTES)
    host = Host(Connection(reader, writer))
    sys.stdout = RunOutputStream(host.connection, "stdout")  # print() and logging: to the kernel
    sys.stderr = RunOutputStream(host.connection, "stderr")
    tasks: set[asyncio.Task[None]] = set()
    while True:
        try:
            line = await reader.readline()
        except (ConnectionError, ValueError):
            break
        if not line:
            break  # the kernel closed its end: this host is done
        try:
            message = p.decode(line)
        except ValueError:
            host.connection.send(p.error(None, p.PARSE_ERROR, "not a JSON object"))
            continue
        if "method" in message:
            task = asyncio.create_task(host.handle(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            host.connection.answered(message)
    os._exit(0)


def main() -> None:
    die_with_parent()
    if os.getppid() == 1:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the kernel decides
    asyncio.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
