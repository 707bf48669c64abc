"""Atomic runs: ``@app.actor(..., effects="atomic")`` (docs/advanced/effects.md).

Everything a run does becomes visible with its queue row's completion, or
not at all. The run holds its instance's database from start to commit
(``InstanceDatabase.begin_run``): state and SQL writes stay in one open
SQLite transaction, which the run's reads see. Effect ops (appends,
schedules, child instances, conversation posts) are checked when called
and kept as JSON records; nothing reaches the store before the commit.

The commit, when process() returned:

- the database is kept in the store (``pg_sqlite``): commit the SQLite
  transaction in memory, then one store transaction writes its image,
  performs the records and deletes the queue row (``commit_run``). If that
  transaction fails, the in-memory copy is dropped and reloaded.
- the database is a file or in S3: the SQLite commit also writes the
  *applied marker* (the queue row id, the event id and the records,
  ``_yoke_applied``)
  and is made durable (S3: uploaded) before one store transaction performs
  the records and deletes the queue row. A later run of the same row that
  finds its marker runs no user code: it performs the recorded effects and
  completes the row (the state writes are already in).

A crash at any step leaves either nothing (the row runs again from the
start) or the marker (the row's next run replays its records), and the
store transaction is all or nothing with the row's deletion, so each
event's effects happen once. A run that wrote nothing to its database
needs no marker: its store transaction is the whole commit.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from .. import errors
from ..events import prepare, validate_path
from ..lifecycle import GLOBAL
from ..store.actors import InstanceInfo, Message, QueueRow, RunAppend, RunCommit, Schedule
from ..streams.append import new_stream_id, refusal_error
from ..tracing import stamp
from . import crash_points
from .context import CONVERSATION_STREAM

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..events import PreparedEvent
    from ..store.inputs import Completion
    from .kernel import ActorKernel


log = logging.getLogger("yoke.actors.atomic")


class RunLost(Exception):
    """The queue row is no longer this run's (its lease ended): nothing committed."""


class AtomicRun:
    """One atomic run of queue row ``row`` of ``instance``."""

    def __init__(self, kernel: ActorKernel, instance: InstanceInfo, row: QueueRow) -> None:
        self._kernel = kernel
        self.tenant = instance.tenant
        self.instance = instance
        self.row = row
        self.db = kernel.state_databases().get(self.tenant, instance.instance_id)
        self.records: list[dict[str, Any]] = []  # the effects, in call order, as JSON
        self._holding = False
        self.replaying = False
        # The input its commit keeps (store/inputs.py), as the scheduler makes it.
        self.kept: Callable[[], Completion] | None = None

    # --- start and end ---------------------------------------------------------

    async def start(self) -> bool:
        """Hold the instance's database. True when this row's run committed
        its state before (the marker): then no user code runs, ``commit``
        performs the recorded effects."""
        await self.db.begin_run()
        self._holding = True
        if not self.db.keeps_state_in_store:
            marker = await self.db.applied(self.row.qid)
            if marker is not None:
                self.records, self.replaying = marker["records"], True
                if marker["event_id"] != self.row.event.get("id"):
                    # Replayed with a corrected event (docs/advanced/failures.md): the
                    # original run's state is in, so its effects complete it.
                    log.warning(
                        "queue row %s: its atomic run of event %s committed its state; its recorded"
                        " effects are performed and event %s is not run", self.row.qid,
                        marker["event_id"], self.row.event.get("id"),
                    )
        return self.replaying

    async def commit(self) -> None:
        try:
            marked = False
            if self.replaying:
                await self.db.rollback_run()
                await self.db.make_durable()  # its upload may be what failed last time
                crash_points.reached("replay")
                await self._store_commit(None)
                marked = True
            else:
                crash_points.reached("before_commit")
                marker = {"event_id": self.row.event.get("id"), "records": self.records}
                try:
                    wrote, image = await self.db.commit_run(self.row.qid, marker)
                    marked = wrote and image is None
                    crash_points.reached("local_commit")  # S3: uploaded too
                    await self._store_commit(image)
                except BaseException:
                    # pg_sqlite: the copy in memory may be ahead of the store's
                    # (a failure or cancellation even inside the local commit).
                    if self.db.keeps_state_in_store:
                        await self.db.reload()
                    raise
            crash_points.reached("store_commit")
            if marked:
                self.db.applied_done(self.row.qid)
        finally:
            self._release()

    async def abort(self) -> None:
        """The run failed or was cancelled: drop its writes and records."""
        if not self._holding:
            return
        try:
            await self.db.rollback_run()
        finally:
            self._release()

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.db.end_run()

    # --- effects, kept until the commit ---------------------------------------

    def append(self, path: str, event: dict[str, Any], trace: dict[str, str] | None = None) -> dict[str, Any]:
        """``trace``: the run's context, stamped on the event when it is
        prepared for the commit (after its fingerprint, ``tracing.stamp``)."""
        validate_path(path)
        if event.get("ephemeral"):
            raise errors.InvalidInput(
                "an atomic run's appends are durable: no ephemeral events", field="ephemeral"
            )
        prepared = self._prepare(event)
        record = {"op": "append", "stream": path, "event": event, "id": prepared.id}
        if trace:
            record["trace"] = trace
        self.records.append(record)
        return {"offset": None, "id": prepared.id}

    def upsert_schedule(self, schedule: Schedule) -> dict[str, Any]:
        self.records.append({"op": "schedule", "schedule": dataclasses.asdict(schedule)})
        return {"name": schedule.name, "due_at": schedule.due_at}

    async def cancel_schedule(self, name: str) -> dict[str, Any]:
        """Answers whether the schedule exists as the run sees it (stored,
        then this run's own upserts and cancels)."""
        existing = await self._kernel.actors().schedules(self.tenant, self.instance.instance_id)
        found = any(s.name == name for s in existing)
        for r in self.records:
            if r["op"] == "schedule" and r["schedule"]["name"] == name:
                found = True
            elif r["op"] == "cancel" and r["name"] == name:
                found = False
        self.records.append({"op": "cancel", "name": name})
        return {"cancelled": found}

    async def create_instance(self, new: InstanceInfo) -> InstanceInfo:
        """The existing instance (actor, key), or this run's (created at the commit)."""
        for r in self.records:
            if r["op"] == "instance" and (r["instance"]["actor"], r["instance"]["key"]) == (new.actor, new.key):
                return InstanceInfo(**r["instance"])
        existing = await self._kernel.actors().find_instance(self.tenant, new.actor, new.key)
        if existing is not None:
            return existing
        self.records.append({"op": "instance", "instance": dataclasses.asdict(new)})
        return new

    def post_message(self, message: Message, event: PreparedEvent) -> dict[str, Any]:
        self.records.append({
            "op": "message", "message": dataclasses.asdict(message), "id": event.id,
            "event": {"type": event.type, "payload": {"conversation_id": message.conversation_id,
                                                       "message_id": message.message_id},
                      "correlation": message.conversation_id, "source": self._source()},
        })
        return {
            "conversation_id": message.conversation_id, "message_id": message.message_id, "seq": None,
            "role": message.role, "content": message.content, "metadata": message.metadata,
            "at": None, "offset": None,
        }

    # --- the store transaction ---------------------------------------------------

    def _source(self) -> dict[str, str]:
        return {"actor": self.instance.actor, "instance": self.instance.instance_id}

    def _prepare(self, event: dict[str, Any], event_id: str | None = None) -> PreparedEvent:
        prepared = prepare(event, max_event_bytes=self._kernel.settings.max_event_bytes)
        if event_id is not None:
            prepared.id = event_id  # the id the run was given
        return prepared

    def _run_commit(self, image: bytes | None) -> RunCommit:
        kept = None if self.kept is None else self.kept()
        run = RunCommit(
            self.row.qid, self.row.attempts, self.instance.instance_id, state=image,
            code_version=None if kept is None else kept.code_version, tape=None if kept is None else kept.tape,
            keep=True if kept is None else kept.keep,
        )
        for r in self.records:
            op = r["op"]
            if op == "append":
                prepared = self._prepare(r["event"], r["id"])
                if r.get("trace"):
                    stamp([prepared], r["trace"])
                run.appends.append(RunAppend(r["stream"], prepared))
            elif op == "message":
                run.appends.append(RunAppend(
                    CONVERSATION_STREAM, self._prepare(r["event"], r["id"]), Message(**r["message"])
                ))
            elif op == "schedule":
                run.schedules.append(Schedule(**r["schedule"]))
            elif op == "cancel":
                run.schedules.append(r["name"])
            elif op == "instance":
                run.instances.append(InstanceInfo(**r["instance"]))
        run.stream_ids.update((a.path, new_stream_id()) for a in run.appends)
        return run

    async def _store_commit(self, image: bytes | None) -> None:
        run = self._run_commit(image)
        kernel = self._kernel
        status, path = await kernel.actors().commit_run(self.tenant, run, kernel.now_ms())
        if status == "lost":
            raise RunLost(f"queue row {self.row.qid} is no longer this run's: nothing committed")
        if status != "ok":
            assert path is not None
            raise refusal_error(status, path, [a.event for a in run.appends if a.path == path])
        for stream, appends in run.by_stream():
            kernel.appended(self.tenant, stream, len(appends))
        if run.schedules:
            dues = [s.due_at for s in run.schedules if isinstance(s, Schedule)]  # (a name: a cancel)
            kernel.signals.timers_changed.emit(min(dues, default=None))
        if run.instances:
            kernel.signals.routing_changed.emit(self.tenant)
            kernel.hub.wake(self.tenant, GLOBAL)

