"""Replay an instance's kept inputs in a sandbox: the engine of a fork.

A replay runs the actor's ``process(ctx, event)`` for each input, in order,
on a database of its own (``SandboxStorage``: in memory, from empty, as
the instance began), with the actor kernel's parts swapped so that nothing
reaches the live system: the state databases are the sandbox's, and the
store, the streams and the inputs refuse. ``ForkOps`` stands between ctx
and the real op handler:

- state and ``ctx.sqlite`` ops run on the sandbox database, as live;
- effect ops (appends, schedules, children, conversation posts) are
  recorded in the fork, never performed; each is answered what the original
  run got for the same op (by content and occurrence, as the journal
  matches a retry's, journal.py), or, for an op the original run did not
  make, a made-up answer (an append's id, no offset);
- reads of the outside world (portal calls, schedule and message
  listings) are answered from the original run's tape; one it did not
  make is refused (``ForkRefused``), in the fork's report;
- ``ctx.now()`` gives the original run's readings in turn, ``ctx.random()``
  draws from the original run's seed.

Runs replay where they ran live: a Node actor's, and an isolated Python
actor's (``isolation="process"``, its App importable by name), in a host
started for the replay; the others' in this process. The actor's timeout applies. Atomic actors' runs
commit their state writes together or not at all, as live.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sqlite3
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..events import MAX_DEPTH, json_bytes, new_event_id
from ..hosts.languages import node_launch, python_launch
from ..hosts.pool import HandlerFailed, HostFailure, HostPool
from ..hosts.wire import yoke_error
from ..store.actors import InstanceInfo
from ..store.inputs import InputRecord
from .app import find_spec
from .context import Context
from .journal import EFFECT_OPS, Journal, digest
from .ops import PARAMS_WRAPPING, OpHandler, instance_dict
from .scheduler import event_from_document
from .state import InstanceDatabase, StateDatabases, _configure
from .tape import TAPED_OPS

if TYPE_CHECKING:
    from .app import ActorDef, App
    from .kernel import ActorKernel


class SandboxStorage:
    """Instance databases in memory, starting empty (or from ``image``);
    nothing is ever written anywhere else."""

    in_store = True  # an atomic run's commit hands the image back instead of writing a marker

    def __init__(self, image: bytes | None = None) -> None:
        self._image = image

    def open(self, tenant: str, instance_id: str) -> sqlite3.Connection:
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        if self._image:
            conn.deserialize(self._image)
        return _configure(conn)

    def persist(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> None:
        return None

    def durable(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> None:
        return None

    async def close(self) -> None:
        return None


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_: Any, **__: Any) -> Any:
        raise errors.ForkRefused(f"a fork cannot reach the live {what}")

    return refuse


def sandbox_kernel(kernel: ActorKernel, databases: StateDatabases) -> ActorKernel:
    """``kernel`` with the sandbox's databases, and nothing live to reach."""
    return dataclasses.replace(
        kernel, state_databases=lambda: databases, actors=_refuse("store"), inputs=_refuse("inputs"),
        stream=_refuse("streams"), read=_refuse("streams"), appended=lambda *_: None,
    )


class TapeAnswers:
    """The original run's answers, by op content and occurrence."""

    def __init__(self, tape: dict[str, Any] | None) -> None:
        tape = tape or {}
        self.by_op: dict[tuple[str, int], dict[str, Any]] = {}
        seen: Counter[str] = Counter()
        for op in tape.get("ops", []):
            d = digest(op["op"], op["params"])
            self.by_op[(d, seen[d])] = op
            seen[d] += 1
        self._seen: Counter[str] = Counter()
        self.now = list(tape.get("now", []))
        self.seed = tape.get("seed")

    def take(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        d = digest(method, params)
        occurrence = self._seen[d]
        self._seen[d] += 1
        return self.by_op.get((d, occurrence))


def _made_up(method: str, p: dict[str, Any], instance: InstanceInfo, now_ms: int) -> Any:
    """The answer of an effect op the original run did not make."""
    if method == "stream_append":
        return {"offset": None, "id": new_event_id()}
    if method == "schedules_upsert":
        return {"name": p.get("name"), "due_at": None}
    if method == "schedules_cancel":
        return {"cancelled": False}
    if method == "instances_create":
        made = InstanceInfo(
            "inst_fork_" + new_event_id()[:16], instance.tenant, str(p.get("actor")), p.get("key") or "",
            p.get("config") or {}, p.get("filter"), instance.instance_id, None, now_ms,
        )
        return instance_dict(made)
    return {  # conversations_post
        "conversation_id": p.get("conversation_id"), "message_id": "msg_" + new_event_id(), "seq": 0,
        "role": p.get("role"), "content": p.get("content"), "metadata": p.get("metadata") or {}, "at": now_ms,
        "offset": None,
    }


class ForkOps:
    """What ctx calls in a fork's run (see the module's docstring)."""

    def __init__(self, inner: OpHandler, record: InputRecord | None, started_at: float, place: str) -> None:
        self._inner = inner
        self._place = place
        self.tenant = inner.tenant
        self.instance = inner.instance
        self.journal = inner.journal  # its qid: the run's queue row (ctx.idempotency_key)
        self.answers = TapeAnswers(None if record is None else record.tape)
        self._started_at = started_at
        self._readings = 0
        self._rng: random.Random | None = None
        self.ops: list[dict[str, Any]] = []  # what this run did outside its database, in call order
        self.refused: list[str] = []

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        if method not in TAPED_OPS:
            return await self._inner.call(method, params)
        p = orjson.loads(json_bytes(params, "params", depth=MAX_DEPTH + PARAMS_WRAPPING))
        recorded = self.answers.take(method, p)
        if method in EFFECT_OPS:
            if recorded is None:
                answer = _made_up(method, p, self.instance, int(self._started_at * 1000))  # type: ignore[arg-type]
            elif "error" in recorded:
                self.ops.append({"op": method, "params": p, "error": recorded["error"]})
                raise yoke_error(recorded["error"]["message"], recorded["error"])
            else:
                answer = recorded["answer"]
            self.ops.append({"op": method, "params": p, "answer": answer})
            return answer
        if recorded is None:
            message = (f"{method} was not made by the original run: a fork answers reads of the outside world"
                       " only from what the original run recorded")
            self.refused.append(message)
            raise errors.ForkRefused(message, op=method)
        if "error" in recorded:
            raise yoke_error(recorded["error"]["message"], recorded["error"])
        return recorded["answer"]

    def update_lock(self) -> asyncio.Lock:
        return self._inner.update_lock()

    def now(self) -> float:
        readings = self.answers.now
        if self._readings < len(readings):
            self._readings += 1
            return readings[self._readings - 1]
        return readings[-1] if readings else self._started_at

    def clock_reading(self) -> tuple[float, bool]:
        return self.now(), False

    def seed(self) -> int:
        """The run's seed (ctx.random(), a host's too): the original run's; a
        run that drew nothing live (an inserted event, a run that failed
        first) draws the same in every fork, from the input's place."""
        if self.answers.seed is not None:
            return self.answers.seed
        return random.Random(self._place).getrandbits(64)

    def random(self) -> float:
        if self._rng is None:
            self._rng = random.Random(self.seed())
        return self._rng.random()


@dataclass
class Replayed:
    """What a replay did: one entry per run, and the database it ended with."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    image: bytes = b""

    @property
    def summary(self) -> dict[str, Any]:
        failed = [r for r in self.runs if r["outcome"] == "failed"]
        return {
            "runs": len(self.runs), "failed": len(failed),
            "effects": sum(1 for r in self.runs for op in r["ops"] if op["op"] in EFFECT_OPS),
            "refused": sum(len(r["refused"]) for r in self.runs),
        }


async def replay(
    kernel: ActorKernel, app: App, instance: InstanceInfo, inputs: list[dict[str, Any]],
) -> Replayed:
    """Run ``inputs`` (each ``{"record": InputRecord | None, "event": dict,
    "seq": int | None}``, in order) through ``instance``'s actor of ``app``
    on a sandbox database."""
    definition = app.actors.get(instance.actor)
    if definition is None or (definition.handler is None and definition.script is None):
        raise errors.InvalidInput(
            f"the application has no actor {instance.actor!r} to replay this instance with",
            field="app", actor=instance.actor,
        )
    databases = StateDatabases(SandboxStorage(), threads=1, clock=kernel.clock)
    sandbox = sandbox_kernel(kernel, databases)
    db = databases.get(instance.tenant, instance.instance_id)
    done = Replayed()
    # The runs go where they would run: a Node actor's and an isolated
    # Python actor's in a host of their own for this replay, the others here.
    pool = None
    settings = kernel.settings
    if definition.handler is None:
        launch = node_launch({definition.name: definition.script}, settings.host_memory_mb)  # type: ignore[dict-item]
    elif (definition.isolation or settings.isolation) == "process" and find_spec(app) is not None:
        launch = python_launch(find_spec(app))  # type: ignore[arg-type]
    else:
        launch = None
    if launch is not None:
        pool = HostPool(launch, size=1, memory_limit_bytes=settings.host_memory_mb * 2**20)
    try:
        for item in inputs:
            done.runs.append(await _run_one(sandbox, app, definition, instance, db, item, pool))
        done.image = await db.image()
    finally:
        if pool is not None:
            await pool.close()
        await databases.close()
    return done


async def _run_one(
    kernel: ActorKernel, app: App, definition: ActorDef, instance: InstanceInfo, db: InstanceDatabase,
    item: dict[str, Any], pool: HostPool | None,
) -> dict[str, Any]:
    record: InputRecord | None = item["record"]
    qid = record.qid if record is not None else 0
    started_at = ((record.started_at or record.processed_at) / 1000) if record is not None else kernel.clock.wall()
    inner = OpHandler(kernel, app, instance.tenant, instance, Journal(qid, instance.instance_id))
    ops = ForkOps(inner, record, started_at, f"{instance.instance_id}:{item['label']}")
    event = event_from_document(instance.tenant, item["event"])
    attempt = record.attempts if record is not None else 1
    atomic = definition.effects == "atomic"
    error = tb = None
    try:
        async with asyncio.timeout(definition.timeout_s):
            if atomic:
                await db.begin_run()
            try:
                if pool is not None:
                    host = await pool.acquire()
                    await pool.process(host, ops, instance, event, attempt)  # type: ignore[arg-type]
                else:
                    ctx = Context(ops, instance, event, attempt, qid or None)  # type: ignore[arg-type]
                    await definition.handler(ctx, ctx.event)  # type: ignore[misc]
                if atomic:
                    await db.commit_run(qid, None)
            finally:
                if atomic:
                    await db.rollback_run()  # nothing if it committed
                    db.end_run()
    except TimeoutError:
        error, tb = f"process() timed out after {definition.timeout_s:g}s", traceback.format_exc()
    except HandlerFailed as exc:  # raised in its host: the host's traceback
        error, tb = exc.message, exc.traceback
    except HostFailure as exc:
        error, tb = f"host failure: {exc}", ""
    except Exception as exc:  # the run's failure, in the report
        error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    return {
        "seq": item["seq"], "label": item["label"], "inserted": item["seq"] is None,
        "edited": item.get("edited", False), "event": item["event"],
        "outcome": "failed" if error is not None else "done", "error": error,
        "traceback": tb[-16_384:] if tb else None, "ops": ops.ops, "refused": ops.refused,
        "live_outcome": None if record is None else record.outcome,
    }
