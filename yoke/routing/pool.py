"""EvaluatorPool: evaluator processes (evaluator.py) shared fairly by tenants.

Jobs wait in one queue per tenant, and tenants take turns: an idle process
takes the first job of the next tenant in turn. A process works on a job
for at most a slice (``SLICE_MS``, plus the one evaluation under way, itself
bounded by filters.EVALUATION_TIMEOUT_MS) and answers for the documents it
got through; the rest goes to the back of its tenant's queue. So a tenant
with many slow expressions gets its turns like any other and never more:
one tenant holds at most all processes but one (``size - 1``; the one
when ``size`` is 1), so another tenant's evaluation starts at once.

A process that has used ``DEADLINE_S`` of CPU on a slice without answering
is killed (the slice's first document fails) and replaced, as is one that
dies.
Processes start on first use (all of them), so a runtime whose expressions
all run on the event loop starts none.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .. import errors
from .evaluator import HEADER, frame
from .filters import EVALUATION_TIMEOUT_MS

log = logging.getLogger("yoke.routing.pool")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_YOKE_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the yoke package

SLICE_MS = 20
# A slice and the evaluation under way at its end use about a second of CPU
# at most (bounds count CPU time); a process that has used three times that
# on one job is stuck in one step that checks no bound. Counted in CPU time
# (from /proc): at its lower priority on busy cores a process may wait for
# the CPU much longer than it runs. WALL_DEADLINE_S bounds the wait anyway.
DEADLINE_S = 3 * (SLICE_MS + EVALUATION_TIMEOUT_MS) / 1000
WALL_DEADLINE_S = 120.0
CHECK_S = 1.0
START_TIMEOUT_S = 30.0
# At most this much of a job's documents (JSON) goes to a process at once.
SEND_BYTES = 1024 * 1024


@dataclass(eq=False)
class Job:
    tenant: str
    expression: str
    what: str
    documents: list[Any]
    stop_at_error: bool
    future: asyncio.Future[list[list[Any]]]
    results: list[list[Any]] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)  # the documents, as JSON, as far as sent
    sent: int = 0  # documents in the slice under way

    def finished(self) -> bool:
        if self.stop_at_error and self.results and not self.results[-1][0]:
            return True
        return len(self.results) >= len(self.documents)


class _Process:
    """One evaluator process and the pool's end of its socket."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proc = proc
        self.reader = reader
        self.writer = writer

    async def ask(self, body: bytes) -> list[list[Any]]:
        """The process's answer to ``body``; TimeoutError once it has used
        DEADLINE_S of CPU (or waited WALL_DEADLINE_S) without answering."""
        answer = asyncio.ensure_future(self._exchange(body))
        try:
            # The real clock, not the runtime's: a watchdog over an OS
            # process's real CPU and wall time (its stand-in when the CPU
            # time cannot be read), as asyncio.wait's timeout is.
            started, cpu_at_start = time.monotonic(), self.cpu_s()
            while not answer.done():
                await asyncio.wait({answer}, timeout=CHECK_S)
                waited = time.monotonic() - started
                used = waited if cpu_at_start is None else (self.cpu_s() or 0.0) - cpu_at_start
                if not answer.done() and (used > DEADLINE_S or waited > WALL_DEADLINE_S):
                    raise TimeoutError
            return orjson.loads(answer.result())["results"]
        finally:
            answer.cancel()

    async def _exchange(self, body: bytes) -> bytes:
        self.writer.write(frame(body))
        await self.writer.drain()
        return await self._read()

    def cpu_s(self) -> float | None:
        """The CPU seconds the process has used (None where /proc does not say)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            return None

    async def _read(self) -> bytes:
        header = await self.reader.readexactly(HEADER)
        return await self.reader.readexactly(int.from_bytes(header, "big"))

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        self.writer.close()


def _env() -> dict[str, str]:
    """This environment, with this yoke importable wherever it was imported from."""
    found = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_YOKE_ROOT), found]))}


class EvaluatorPool:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise errors.InvalidInput("filter_processes must be at least 1", field="filter_processes")
        self.size = size
        self._queues: dict[str, deque[Job]] = {}
        self._turns: deque[str] = deque()  # tenants with queued jobs, next first
        self._busy: Counter[str] = Counter()  # processes working for each tenant
        self._idle: list[_Process] = []
        self._processes: set[_Process] = set()
        self._starting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.started = 0  # processes started, ever (tests, metrics)

    async def run(self, tenant: str, expression: str, what: str, documents: list[Any],
                  stop_at_error: bool) -> list[list[Any]]:
        """``[ok, value or message]`` for each document in order (through the
        first failure when ``stop_at_error``)."""
        if self._closed:
            raise errors.RuntimeClosed("the evaluator pool is closed")
        job = Job(tenant, expression, what, documents, stop_at_error, asyncio.get_running_loop().create_future())
        self._queue(job)
        self._dispatch()
        return await job.future  # cancelled: the job is dropped at its next turn

    def _queue(self, job: Job) -> None:
        queue = self._queues.get(job.tenant)
        if queue is None:
            queue = self._queues[job.tenant] = deque()
            self._turns.append(job.tenant)
        queue.append(job)

    def _next_job(self) -> Job | None:
        """The first job of the next tenant in turn that may have a process."""
        cap = max(1, self.size - 1)
        for _ in range(len(self._turns)):
            tenant = self._turns[0]
            self._turns.rotate(-1)
            if self._busy[tenant] >= cap:
                continue  # a process stays free for the other tenants
            queue = self._queues[tenant]
            while queue and queue[0].future.done():  # its caller went away
                queue.popleft()
            job = queue.popleft() if queue else None
            if not queue:
                del self._queues[tenant]
                self._turns.remove(tenant)
            if job is not None:
                return job
        return None

    def _dispatch(self) -> None:
        while self._turns and not self._closed:
            if not self._idle:
                # All of them at once: another tenant's turn must not wait for a start.
                while len(self._processes) + self._starting < self.size:
                    self._starting += 1
                    self._spawn(self._start())
                return
            if self._idle[-1].proc.returncode is not None:  # died while idle (killed, say)
                self._discard(self._idle[-1])
                continue
            job = self._next_job()
            if job is None:
                return
            process = self._idle.pop()
            self._busy[job.tenant] += 1
            self._spawn(self._work(process, job))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self) -> None:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "yoke.routing.evaluator", str(theirs.fileno()),
                    pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL, env=_env(),
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=2**31 - 1)
            process = _Process(proc, reader, writer)
            self._processes.add(process)
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await process._read()  # the empty frame: ready
            except BaseException:
                self._discard(process)
                raise
            self.started += 1
            self._idle.append(process)
        except Exception:
            log.exception("an evaluator process did not start")
            self._fail_all(errors.Unavailable("filter evaluation is unavailable: no evaluator process started",
                                              reason="evaluator"))
        finally:
            self._starting -= 1
        self._dispatch()

    async def _work(self, process: _Process, job: Job) -> None:
        try:
            body = self._body(job)
            try:
                results = await process.ask(body)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self._discard(process)
                if isinstance(exc, TimeoutError):
                    why = f"timed out: it did not end within {DEADLINE_S:.0f} s of CPU"
                else:
                    why = f"lost its evaluator process ({exc!r})"
                log.warning("filter evaluation of %s (%s) %s; the process is replaced",
                            job.tenant, job.expression[:80], why)
                results = [[False, f"the evaluation {why}"]]
            else:
                self._idle.append(process)
            job.results.extend(results[: job.sent])
        except asyncio.CancelledError:
            self._discard(process)
            raise
        finally:
            self._busy[job.tenant] -= 1
            if not self._busy[job.tenant]:
                del self._busy[job.tenant]
        if job.future.done():
            pass  # its caller went away
        elif job.finished():
            job.future.set_result(job.results)
        else:
            self._queue(job)  # the rest after the other tenants' turns
        self._dispatch()

    def _body(self, job: Job) -> bytes:
        """The job's next documents (SEND_BYTES of them, one at least) as
        the process's job; each document is encoded once."""
        start = end = len(job.results)
        size = 0
        while end < len(job.documents) and (end == start or size < SEND_BYTES):
            if end == len(job.encoded):
                job.encoded.append(orjson.dumps(job.documents[end]))
            size += len(job.encoded[end])
            end += 1
        job.sent = end - start
        head = orjson.dumps({
            "expression": job.expression, "what": job.what, "stop_at_error": job.stop_at_error,
            "slice_ms": SLICE_MS,
        })
        return head[:-1] + b',"documents":[' + b",".join(job.encoded[start:end]) + b"]}"

    def _discard(self, process: _Process) -> None:
        process.kill()
        self._processes.discard(process)
        if process in self._idle:
            self._idle.remove(process)

    def _fail_all(self, exc: BaseException) -> None:
        for queue in self._queues.values():
            for job in queue:
                if not job.future.done():
                    job.future.set_exception(exc)
        self._queues.clear()
        self._turns.clear()

    async def close(self) -> None:
        self._closed = True
        self._fail_all(errors.RuntimeClosed("the runtime is shutting down"))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        for process in list(self._processes):
            process.writer.close()  # EOF: it exits
        for process in list(self._processes):
            try:
                async with asyncio.timeout(5):
                    await process.proc.wait()
            except TimeoutError:
                process.kill()
                await process.proc.wait()
        self._processes.clear()
        self._idle.clear()
