"""The kernel's side of hosts: a pool of host processes that run isolated
actors' ``process()`` calls (docs/advanced/hosts.md).

A host runs one call at a time, so a crash, a hang or a runaway allocation
costs that run alone: its host is killed or found dead, the run fails with
the reason (HostFailure), the scheduler retries the row as it retries any
failure, and the next run gets a new host. While a run is in progress the
host sends ops; each is answered by the run's own OpHandler, as in-process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import itertools
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import errors
from . import wire as p

if TYPE_CHECKING:
    from ..events import Event
    from ..store.actors import InstanceInfo

log = logging.getLogger("yoke.hosts")


class RunJournal(Protocol):
    qid: int  # the queue row the run processes


class RunOps(Protocol):
    """What a host's ops are answered by: one run's op handler (the
    executor's ``actors.ops.OpHandler``; hosts sit below actors)."""

    tenant: str
    journal: RunJournal | None

    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    def clock_reading(self) -> tuple[float, bool]:
        """The runtime's wall clock now, and whether it runs on by itself
        (False: a test's virtual clock, standing still during a run)."""
        ...

    def seed(self) -> int:
        """The seed of the run's ctx.random() (kept with its input)."""
        ...

# What a host is started without: the kernel's settings (database URL,
# tokens) and the usual database credentials.
SCRUBBED_ENV_PREFIXES = ("YOKE_", "PG", "DATABASE_URL", "AWS_")
INIT_TIMEOUT_S = 60.0
# After a host fails to start (an application that throws at import), the
# next start waits this long, doubling with each failure in a row up to the
# most; runs asking for a host meanwhile fail at once with the reason.
START_BACKOFF_S = 0.5
START_BACKOFF_MAX_S = 30.0


def instance_dict(info: InstanceInfo) -> dict[str, Any]:
    return {
        "instance_id": info.instance_id, "tenant": info.tenant, "actor": info.actor, "key": info.key,
        "config": info.config, "filter": info.filter, "parent_id": info.parent_id,
        "worker_id": info.worker_id, "created_at": info.created_at,
    }


class HostFailure(Exception):
    """A run ended because its host died, was killed or ran out of memory."""


output_log = logging.getLogger("yoke.hosts.output")

# The host whose op is being carried out (set in the op's task): a portal of
# that host's pool called by its run goes to the same host, which is busy
# with that run (another might not be free: a pool of one would deadlock).
CALLER: contextvars.ContextVar[Host | None] = contextvars.ContextVar("yoke_calling_host", default=None)


class RunOutput:
    """What one run printed (wire.RUN_OUTPUT): logged as it comes, under
    the run's ``label`` (actor, key, attempt), and its newest
    ``OUTPUT_KEPT_CHARS`` kept for the run's failure (``section``)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._parts: collections.deque[str] = collections.deque()
        self._size = 0

    def add(self, stream: str, text: str) -> None:
        output_log.info("%s %s: %s", self.label, stream, text.rstrip("\n"))
        self._parts.append(text)
        self._size += len(text)
        while self._size > p.OUTPUT_KEPT_CHARS and len(self._parts) > 1:
            self._size -= len(self._parts.popleft())

    def section(self) -> str:
        """The output, as it is appended to the failure's traceback ("" for none)."""
        if not self._parts:
            return ""
        text = "".join(self._parts)[-p.OUTPUT_KEPT_CHARS:]
        return f"\n\n--- output of this attempt (its last {p.OUTPUT_KEPT_CHARS // 1024} KiB at most) ---\n{text}"


def host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_ENV_PREFIXES)}


def exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "its host closed the connection"
    if returncode == p.EXIT_OUT_OF_MEMORY:
        return "its host reached its memory limit"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"its host died of {name}"
    return f"its host exited with status {returncode}"


class Host:
    """One host process and its end of the socket."""

    def __init__(self, pool: HostPool, proc: asyncio.subprocess.Process,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pool = pool
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.outbox = p.Outbox(writer)
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.runs: dict[int, RunOps] = {}
        self.outputs: dict[int, RunOutput] = {}  # of the runs in progress that collect it
        self.dead: str | None = None  # why, once it is
        self.killed_because: str | None = None
        self.generation = 0  # the pool's generation (code version) it was started in
        self.initialized = False  # host.init answered
        self.looping = False  # it runs a portal's start loop (which holds it)
        self.op_tasks: set[asyncio.Task[None]] = set()
        self.reading = asyncio.create_task(self._read(), name=f"yoke-host-{proc.pid}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def call(self, method: str, params: Any) -> Any:
        if self.dead is not None:
            raise HostFailure(self.dead)
        id_ = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[id_] = future
        try:
            self.outbox.send(p.request(id_, method, params))
            return await future
        finally:
            self.waiting.pop(id_, None)

    async def _read(self) -> None:
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                message = p.decode(line)
                if message.get("method") == p.RUN_OUTPUT and "id" not in message:
                    self._output(message.get("params"))
                elif "method" in message:
                    task = asyncio.create_task(self._op(message))
                    self.op_tasks.add(task)
                    task.add_done_callback(self.op_tasks.discard)
                else:
                    self._answered(message)
        except ConnectionError:
            pass  # the host is gone: its exit status says why
        except (ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("host %s: bad message or connection: %s; killing it", self.pid, exc)
            self.kill("it sent a bad message")
        except asyncio.CancelledError:
            raise
        returncode = await self.proc.wait()
        reason = self.killed_because or exit_reason(returncode)
        self.dead = reason
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(HostFailure(reason))
        for task in list(self.op_tasks):
            task.cancel()
        self.pool.gone(self)

    def _answered(self, message: dict[str, Any]) -> None:
        future = self.waiting.get(message.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(HostError(message["error"]))
        else:
            future.set_result(message.get("result"))

    def _output(self, params: Any) -> None:
        if not isinstance(params, dict) or not isinstance(params.get("text"), str):
            return
        text = params["text"][: p.OUTPUT_MESSAGE_CHARS]
        stream = "stderr" if params.get("stream") == "stderr" else "stdout"
        output = self.outputs.get(params.get("run"))  # type: ignore[arg-type]
        if output is None:  # printed outside a run (at import), or after its end
            output_log.info("host %s %s: %s", self.pid, stream, text.rstrip("\n"))
        else:
            output.add(stream, text)

    async def _op(self, message: dict[str, Any]) -> None:
        CALLER.set(self)
        id_, method = message.get("id"), message.get("method")
        ops = self.runs.get(message.get("run"))  # type: ignore[arg-type]
        if ops is None:
            answer = p.error(id_, p.RUN_OVER, "no run in progress with that id on this host")
        else:
            try:
                params = message.get("params")
                if not isinstance(params, dict) or not isinstance(method, str):
                    raise errors.InvalidInput("an op is a method name and an object of params")
                answer = p.result(id_, wire_result(method, await ops.call(method, params)))
            except errors.YokeError as exc:
                answer = p.error(id_, p.OP_FAILED, exc.message, {"code": exc.code, "details": exc.details})
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a kernel fault: the handler sees it as a failed op
                log.exception("op %s from host %s failed", method, self.pid)
                answer = p.error(id_, p.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        if self.dead is None:
            try:
                self.outbox.send(answer)
            except (TypeError, ValueError) as exc:  # not JSON: the handler hears of it, at once
                log.exception("op %s from host %s: its answer could not be encoded", method, self.pid)
                self.outbox.send(p.error(id_, p.OP_FAILED, f"the op's answer could not be sent: {exc}",
                                         {"code": "yoke_error", "details": {"op": str(method)}}))

    def kill(self, because: str) -> None:
        if self.dead is None and self.killed_because is None:
            self.killed_because = because
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.reading


def wire_result(method: str, result: Any) -> Any:
    """An op's answer as the host protocol carries it: SQLite values tagged
    where JSON cannot carry them exactly (wire.py)."""
    if method == "sqlite_query":
        return p.sql_rows_to_wire(result)
    if method == "sqlite_exec":
        return {k: p.sql_to_wire(v) for k, v in result.items()}
    return result


class HostError(Exception):
    """A JSON-RPC error answer from a host."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.code = body.get("code")
        self.message = str(body.get("message", "host error"))
        self.data = body.get("data") or {}
        super().__init__(self.message)


class HandlerFailed(Exception):
    """The handler raised in its host: the message is the host's
    ``Type: message`` and the traceback the host's."""

    def __init__(self, message: str, traceback: str) -> None:
        super().__init__(message)
        self.message = message
        self.traceback = traceback


@dataclass(frozen=True)
class Launch:
    """How to start one kind of host: its command line (the socket's
    descriptor number is added as the last argument) and what ``host.init``
    tells it besides the protocol version and the memory limit."""

    language: str
    command: tuple[str, ...]
    init: dict[str, Any] = field(default_factory=dict)


class HostPool:
    """Up to ``size`` host processes of one application, each running one
    ``process()`` call at a time; made on demand, reused, replaced when
    they die."""

    def __init__(self, launch: Launch, *, size: int, runs_per_host: int = 1, memory_limit_bytes: int = 0) -> None:
        self.launch = launch
        self.size = max(size, 1)
        self.memory_limit_bytes = memory_limit_bytes
        # One entry per free run slot: a host is listed runs_per_host times when idle.
        self.runs_per_host = max(runs_per_host, 1)
        self.idle: list[Host] = []
        self.hosts: set[Host] = set()
        self.starting = 0
        self.waiters: collections.deque[asyncio.Future[Host]] = collections.deque()
        self.runs = itertools.count(1)
        self.closing = False
        self.started = 0  # host processes started (tests: replacements)
        self.warming: set[asyncio.Task[None]] = set()
        self.generation = 0  # raised by recycle(): hosts of older ones take no new runs
        self.failed_starts = 0  # in a row (START_BACKOFF_S)
        self.no_start_until = 0.0  # monotonic
        self.start_failure = ""  # why the last start failed

    async def acquire(self) -> Host:
        """An idle started host of this pool; waits while all are busy
        (starting one when the pool is below its size)."""
        if self.closing:
            raise HostFailure("the host pool is closing")
        if self.idle:
            return self.idle.pop()
        if not self.hosts and not self.starting and time.monotonic() < self.no_start_until:
            raise HostFailure(f"{self.start_failure} (the next start is in"
                              f" {self.no_start_until - time.monotonic():.1f}s)")
        waiter: asyncio.Future[Host] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.warm()  # below its size (a host died): start one
        try:
            host = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())  # handed over as we were cancelled: pass it on
            raise
        return host

    async def process(
        self, host: Host, ops: RunOps, instance: InstanceInfo, event: Event, attempt: int,
        output: RunOutput | None = None, *, trace: dict[str, str] | None = None,
    ) -> None:
        """Run ``process(ctx, event)`` in ``host`` (from acquire()), then give
        the host back. Cancelled (the run's timeout or shutdown), or failing
        with the host, the host is killed: it may still be running the handler.
        ``output`` collects what the run prints; ``trace``: the attempt span's
        W3C context, which the host makes current around the handler."""
        run = next(self.runs)
        host.runs[run] = ops
        if output is not None:
            host.outputs[run] = output
        finished = False
        try:
            params = {
                "run": run, "actor": instance.actor, "tenant": ops.tenant,
                "instance": instance_dict(instance), "event": event.to_dict(), "attempt": attempt,
                "queue_row": None if ops.journal is None else ops.journal.qid,
                "clock": dict(zip(("now", "runs"), ops.clock_reading(), strict=True)),
                "seed": ops.seed(),
            }
            if trace:
                params["trace"] = trace
            try:
                await host.call("actor.process", params)
            except HostError as exc:
                if exc.code == p.HANDLER_FAILED:
                    finished = True  # the host is fine: the handler raised
                    raise HandlerFailed(exc.message, exc.data.get("traceback", "")) from None
                if exc.code == p.OUT_OF_MEMORY:
                    host.kill(exc.message)
                    raise HostFailure(exc.message) from None
                raise HostFailure(f"the host refused the run: {exc.message}") from None
            finished = True
        finally:
            host.runs.pop(run, None)
            host.outputs.pop(run, None)
            if finished and host.dead is None:
                self._release(host)
            else:
                # Other runs on it (runs_per_host > 1) fail with this reason.
                host.kill(host.killed_because or "another run on the host timed out or was cancelled")
                self._forget(host)

    def calling_host(self) -> Host | None:
        """The host of this pool whose op is being carried out, if any."""
        host = CALLER.get()
        return host if host is not None and host in self.hosts and host.dead is None else None

    async def portal(
        self, host: Host, ops: RunOps, portal: str, kind: str, payload: dict[str, Any], *, borrowed: bool = False,
    ) -> Any:
        """Run a portal's ``handle`` (``kind`` "request") or one of its
        methods ("method") in ``host`` (from acquire()) with ``ops`` as its
        ctx's, then give the host back; its answer (``{status, body}``, or
        ``{body}``). A thrown error fails the call with its message (the
        portal route answers 500, a caller of the method PortalCallFailed);
        cancelled or failing with the host, the host is killed, as for a run
        (``borrowed``: the host of the run that called, from
        ``calling_host``; it is neither given back nor killed here)."""
        run = next(self.runs)
        host.runs[run] = ops
        if kind == "start":
            host.looping = True  # recycle() ends it: the loop starts again on the new code
        finished = False
        try:
            params = {"run": run, "portal": portal, "tenant": ops.tenant, "kind": kind, **payload,
                      "clock": dict(zip(("now", "runs"), ops.clock_reading(), strict=True))}
            try:
                answer = await host.call("portal.call", params)
            except HostError as exc:
                if exc.code == p.HANDLER_FAILED:
                    finished = True
                    raise HandlerFailed(exc.message, exc.data.get("traceback", "")) from None
                if exc.code == p.OP_FAILED:  # the portal threw a YokeError: the same error, here
                    finished = True
                    raise p.yoke_error(exc.message, exc.data) from None
                raise HostFailure(f"the host refused the portal call: {exc.message}") from None
            finished = True
            return answer
        finally:
            host.runs.pop(run, None)
            if borrowed:
                pass  # the calling run's host: it stays that run's
            elif finished and host.dead is None:
                self._release(host)
            else:
                host.kill(host.killed_because or "a portal call on the host timed out or was cancelled")
                self._forget(host)

    async def receive(self, host: Host, receiver: str, batch: dict[str, Any]) -> None:
        """Run a subscription receiver's ``receivers[name](batch)`` in
        ``host`` (from acquire()), then give the host back; a thrown error
        fails the batch with its message (HandlerFailed)."""
        finished = False
        try:
            try:
                await host.call("receiver.call", {"receiver": receiver, "batch": batch})
            except HostError as exc:
                if exc.code == p.HANDLER_FAILED:
                    finished = True
                    raise HandlerFailed(exc.message, exc.data.get("traceback", "")) from None
                raise HostFailure(f"the host refused the receiver call: {exc.message}") from None
            finished = True
        finally:
            if finished and host.dead is None:
                self._release(host)
            else:
                host.kill(host.killed_because or "a receiver call on the host timed out or was cancelled")
                self._forget(host)

    def warm(self) -> None:
        """Start hosts in the background up to the pool's size, so runs do
        not wait for a start (a run's timeout does not include one anyway)."""
        if self.closing:
            return
        if time.monotonic() < self.no_start_until:
            if not self.hosts and not self.starting:  # none left to hand out: waiting runs fail now
                self._fail_waiters(HostFailure(f"{self.start_failure} (the next start is in"
                                               f" {self.no_start_until - time.monotonic():.1f}s)"))
            return
        for _ in range(self.size - len(self.hosts) - self.starting):
            self.starting += 1
            task = asyncio.get_running_loop().create_task(self._warm_one())
            self.warming.add(task)
            task.add_done_callback(self.warming.discard)

    async def ready(self) -> None:
        """Until the hosts warm() started are up (or failed to start)."""
        if self.warming:
            await asyncio.wait(set(self.warming))

    async def _warm_one(self) -> None:
        try:
            host = await self._start()
            self.failed_starts = 0
        except Exception as exc:
            self.failed_starts += 1
            delay = min(START_BACKOFF_S * 2 ** (self.failed_starts - 1), START_BACKOFF_MAX_S)
            self.no_start_until = time.monotonic() + delay
            self.start_failure = str(exc)
            log.warning("could not start a host (%d in a row; the next start in %.1fs at the earliest): %s",
                        self.failed_starts, delay, exc)
            # Runs waiting for a host fail rather than wait for one that
            # cannot start (the next run tries again).
            self._fail_waiters(HostFailure(str(exc)))
            return
        finally:
            self.starting -= 1
        for _ in range(self.runs_per_host):
            self._release(host)

    def _fail_waiters(self, failure: HostFailure) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(failure)

    def release(self, host: Host) -> None:
        """Give back a host from acquire() that ran nothing."""
        self._release(host)

    def _release(self, host: Host) -> None:
        if host.dead is not None or host not in self.hosts:
            return
        if host.generation != self.generation:  # older code: retire it once its runs end
            if not host.runs and host not in self.idle:  # its last slot came back
                self._retire(host)
            return
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(host)
                return
        self.idle.append(host)

    def recycle(self) -> None:
        """The application's code changed: new runs go to new hosts (which
        import it afresh); idle hosts end now, busy ones when their runs end,
        so no run is cut short or run twice."""
        self.generation += 1
        for host in list(self.hosts):
            if self.idle.count(host) == self.runs_per_host:  # none of its slots taken
                self._retire(host)
            elif host.looping:  # a portal's loop never ends by itself: it restarts on the new code
                host.kill("the code changed: the portal loop on it starts again on the new code")
        self.idle = [h for h in self.idle if h.generation == self.generation]
        self.warm()

    def _retire(self, host: Host) -> None:
        self._forget(host)
        host.killed_because = "retired (the code changed)"
        host.writer.close()  # end of file: the host exits

    def _forget(self, host: Host) -> None:
        self.hosts.discard(host)
        if host in self.idle:
            self.idle = [h for h in self.idle if h is not host]

    def gone(self, host: Host) -> None:
        """A host's process ended (its reader saw it)."""
        self._forget(host)
        if not self.closing and host.killed_because is None:
            log.warning("host %s: %s", host.pid, host.dead)
        if not self.closing and host.initialized:
            self.warm()  # its replacement (one that never started is _warm_one's to retry)

    async def _start(self) -> Host:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.launch.command, str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), env=host_env(), stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=p.MAX_MESSAGE_BYTES)
        host = Host(self, proc, reader, writer)
        host.generation = self.generation
        self.hosts.add(host)
        self.started += 1
        try:
            async with asyncio.timeout(INIT_TIMEOUT_S):
                await host.call("host.init", {
                    "protocol": p.PROTOCOL_VERSION, **self.launch.init,
                    "memory_limit_bytes": self.memory_limit_bytes,
                })
        except BaseException as exc:
            host.kill("it did not start")
            self._forget(host)
            if isinstance(exc, HostError):
                raise HostFailure(f"a host could not start: {exc.message}") from None
            if isinstance(exc, TimeoutError):
                raise HostFailure(f"a host did not start within {INIT_TIMEOUT_S:.0f}s") from None
            raise
        host.initialized = True
        return host

    async def close(self) -> None:
        self.closing = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(HostFailure("the host pool is closing"))
        for task in list(self.warming):
            task.cancel()
        if self.warming:
            await asyncio.wait(set(self.warming))
        hosts = list(self.hosts)
        for host in hosts:
            host.writer.close()  # EOF: the host exits
        for host in hosts:
            try:
                async with asyncio.timeout(5):
                    await host.proc.wait()
            except TimeoutError:
                host.kill("the pool closed")
                # Reaped, not just signalled: when close returns, no host
                # process of this pool is left (not even as a zombie).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await host.proc.wait()
            await host.closed()
        self.hosts.clear()
        self.idle.clear()
