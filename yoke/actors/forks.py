"""Forks of actor instances: make, list, read, diff and discard them
(docs/advanced/forks.md). ``y.forks(tenant)`` returns this handle;
``y.instances(tenant).fork(...)`` makes one; HTTP and the CLI call the
same methods.

A fork replays an instance's kept inputs 1..``upto`` from its creation
(replay.py), under the application's code or another (``app``), with the
inputs edited first if asked, and is kept in the store (store/forks.py)
until it is discarded or expires (``fork_ttl_s``). Nothing live changes:
the replay reaches no stream, queue, schedule or instance database.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import errors
from ..events import prepare
from ..store.forks import ForkRow
from ..store.actors import InstanceInfo
from ..store.inputs import InputRecord
from .app import code_of, find_spec
from .fork_diff import diff_images, diff_runs, effects_of
from .replay import SandboxStorage, replay
from .state import InstanceDatabase, QueryResult, StateDatabases, check_query

if TYPE_CHECKING:
    from .app import App
    from .kernel import ActorKernel

MAX_EDITS = 1000
MAX_FORK_INPUTS = 100_000  # inputs one fork replays (about a minute; its report is kept whole)
PAGE = 1000  # inputs read per round trip
EDIT_ACTIONS = ("replace", "drop", "insert")


@dataclass(frozen=True)
class Fork:
    """A fork: what it was made from and what its runs did in sum (``row``),
    and its handle (``state``, ``query``, ``runs``, ``diff``, ``discard``)."""

    row: ForkRow
    forks: Forks

    @property
    def fork_id(self) -> str:
        return self.row.fork_id

    async def state(self) -> tuple[Any, int]:
        return await self.forks.state(self.fork_id)

    async def query(self, sql: str, params: Sequence[Any] = (), **limits: Any) -> QueryResult:
        return await self.forks.query(self.fork_id, sql, params, **limits)

    async def runs(self) -> list[dict[str, Any]]:
        return await self.forks.runs(self.fork_id)

    async def diff(self, against: Fork | str | None = None) -> dict[str, Any]:
        return await self.forks.diff(self.fork_id, against.fork_id if isinstance(against, Fork) else against)

    async def discard(self) -> None:
        await self.forks.discard(self.fork_id)

    def as_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "fork_id": r.fork_id, "instance_id": r.instance_id, "actor": r.actor, "key": r.key, "upto": r.upto,
            "app": r.app, "edits": r.edits, "summary": r.summary, "created_at": r.created_at,
            "expires_at": r.expires_at,
        }


def check_edits(edits: Any) -> list[dict[str, Any]]:
    """``[{"seq": k, "action": "replace", "payload": ...}, {"seq": k, "action":
    "drop"}, {"seq": k, "action": "insert", "event": {...}}]``: replace input
    k's payload (and, if given, its ``type`` and ``metadata``), drop input k,
    or insert an event before input k."""
    if edits is None:
        return []
    if not isinstance(edits, list) or len(edits) > MAX_EDITS:
        raise errors.InvalidInput(f"edits must be a list of at most {MAX_EDITS} edits", field="edits")
    checked = []
    for edit in edits:
        if not isinstance(edit, dict) or edit.get("action") not in EDIT_ACTIONS:
            raise errors.InvalidInput(
                'an edit is {"seq": N, "action": "replace" | "drop" | "insert", ...}', field="edits"
            )
        seq = edit.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63:
            raise errors.InvalidInput("an edit's seq is an input number (1 or more)", field="edits")
        action = edit["action"]
        allowed = {"seq", "action"} | {"replace": {"payload", "type", "metadata"}, "drop": set(),
                                       "insert": {"event"}}[action]
        if set(edit) - allowed:
            raise errors.InvalidInput(
                f"a {action} edit takes {', '.join(sorted(allowed))}, not {', '.join(sorted(set(edit) - allowed))}",
                field="edits",
            )
        if action == "replace":
            if not {"payload", "type", "metadata"} & set(edit):
                raise errors.InvalidInput("a replace edit gives the input's new payload (type, metadata)", field="edits")
            # A payload, type and metadata the API would take.
            prepare({"type": edit.get("type", "x"), "payload": edit.get("payload"), "metadata": edit.get("metadata") or {}})
        if action == "insert":
            event = edit.get("event")
            if not isinstance(event, dict):
                raise errors.InvalidInput("an insert edit gives the event to insert", field="edits")
            prepare(event)
        checked.append(dict(edit))
    return checked


def superseded(records: list[InputRecord]) -> set[int]:
    """Dead-lettered inputs whose queue row was redriven and ran again later
    (the same row, kept again): replayed once, as the later input."""
    later: set[int] = set()
    gone: set[int] = set()
    for r in reversed(records):
        if r.outcome == "dead" and r.qid in later:
            gone.add(r.seq)
        later.add(r.qid)
    return gone


def edited(records: list[InputRecord], edits: list[dict[str, Any]], now_ms: int) -> list[dict[str, Any]]:
    """The inputs a fork replays: ``records`` with ``edits`` applied (a
    redriven dead letter once, as its later run)."""
    skipped = superseded(records)
    known = {r.seq for r in records}
    for edit in edits:
        if edit["seq"] not in known:
            raise errors.InvalidInput(f"edit of input {edit['seq']}: the fork does not replay it", field="edits")
    inserts: dict[int, list[dict[str, Any]]] = {}
    replaced: dict[int, dict[str, Any]] = {}
    dropped: set[int] = set()
    for edit in edits:
        if edit["action"] == "insert":
            inserts.setdefault(edit["seq"], []).append(edit["event"])
        elif edit["action"] == "replace":
            replaced[edit["seq"]] = {k: v for k, v in edit.items() if k in ("payload", "type", "metadata")}
        else:
            dropped.add(edit["seq"])
    out: list[dict[str, Any]] = []
    for r in records:
        for i, event in enumerate(inserts.get(r.seq, [])):
            document = {
                "offset": 0, "id": f"fork_{secrets.token_hex(12)}", "at": now_ms, "type": event["type"],
                "payload": event.get("payload", {}), "metadata": event.get("metadata") or {},
                "source": event.get("source"), "correlation": event.get("correlation"),
                "priority": event.get("priority") or 0, "group_id": event.get("group_id"),
                "idempotency_key": None, "path": None,
            }
            out.append({"record": None, "event": document, "seq": None, "label": f"inserted before {r.seq} #{i + 1}"})
        if r.seq in dropped or r.seq in skipped:
            continue
        event = dict(r.event)
        if r.seq in replaced:
            event.update(replaced[r.seq])
        out.append({"record": r, "event": event, "seq": r.seq, "label": r.seq, "edited": r.seq in replaced})
    return out


async def load_named(load_app: Callable[[str], App], spec: str) -> App:
    """The application ``spec`` names, loaded off the event loop (it imports,
    or runs node); one that does not load is invalid input, with why."""
    try:
        return await asyncio.to_thread(load_app, spec)
    except errors.YokeError:
        raise
    except Exception as exc:  # ImportError, or whatever the module raised as it loaded
        raise errors.InvalidInput(f"app {spec!r} does not load: {type(exc).__name__}: {exc}"[:1000],
                                  field="app") from None


class Forks:
    """Forks of one tenant. ``instance``: the tenant's instance by id (or
    InstanceNotFound); ``live_image``: an instance's database as an image,
    read where it is current; ``app``: the application forks replay with
    when none is given (the runtime's); ``load_app``: how an ``app`` given as
    ``"module:attribute"`` is loaded; ``ttl_s``: how long a fork is kept;
    ``reload_version``: the code's version under --reload (as the scheduler
    keeps it with each input)."""

    def __init__(
        self, kernel: ActorKernel, tenant: str, instance: Callable[[str], Awaitable[InstanceInfo]],
        live_image: Callable[[str], Awaitable[bytes]], *, app: App | None,
        load_app: Callable[[str], App] | None, ttl_s: float, reload_version: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._kernel = kernel
        self.tenant = tenant
        self._instance = instance
        self._live_image = live_image
        self._app = app
        self._load_app = load_app
        self.ttl_s = ttl_s
        self._reload_version = reload_version  # the code's version under --reload (hosts/reload.py)

    # --- making ------------------------------------------------------------------

    async def create(
        self, instance_id: str, *, upto: int | None = None, app: App | str | None = None,
        edits: Sequence[dict[str, Any]] | None = None,
    ) -> Fork:
        """Replay the instance's inputs 1..``upto`` (all: None) in a sandbox
        under ``app`` (an App, ``"module:attribute"``, or None: the
        runtime's), with ``edits``; keep the fork and return it."""
        row = await self._replayed(instance_id, upto, app, edits)
        await self._kernel.forks().save(row)
        return Fork(row, self)

    async def _replayed(
        self, instance_id: str, upto: int | None, app: App | str | None, edits: Sequence[dict[str, Any]] | None,
    ) -> ForkRow:
        """A fork made, not kept."""
        if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto < 2**63):
            raise errors.InvalidInput("upto must be an input number (0 or more)", field="upto")
        checked = check_edits(list(edits) if isinstance(edits, tuple) else edits)
        instance = await self._instance(instance_id)
        # What the fork says it ran (None: the runtime's own application).
        spec = app if isinstance(app, str) else None if app is None or app is self._app else (
            find_spec(app) or "(an App given in Python)")
        application = await self._application(app)
        definition = application.actors.get(instance.actor)
        if definition is not None and definition.keep_inputs == 0:
            raise errors.InputsPruned(
                f"actor {instance.actor!r} keeps no inputs (keep_inputs=0): its instances cannot be forked",
                instance_id=instance_id,
            )
        if not await self._kernel.inputs().complete(self.tenant, instance_id):
            raise errors.InputsPruned(
                f"{instance_id} ran inputs that were not kept (it existed before inputs were kept, or its actor"
                " kept none): a fork replays from the instance's creation", instance_id=instance_id,
            )
        records = await self._records(instance_id, upto)
        if len(records) > MAX_FORK_INPUTS:
            raise errors.InvalidInput(
                f"{instance_id} has {len(records)} inputs: a fork replays at most {MAX_FORK_INPUTS:,}"
                " (give upto)", field="upto",
            )
        if records and records[0].seq != 1:
            raise errors.InputsPruned(
                f"the inputs of {instance_id} before {records[0].seq} were pruned (the actor's keep_inputs"
                " or keep_inputs_s): a fork replays from the instance's creation", instance_id=instance_id,
            )
        now = self._kernel.now_ms()
        done = await replay(self._kernel, application, instance, edited(records, checked, now))
        return ForkRow(
            tenant=self.tenant, fork_id="fork_" + secrets.token_hex(10), instance_id=instance_id,
            actor=instance.actor, key=instance.key, upto=upto, app=spec, edits=checked,
            summary={**done.summary, "inputs": len(records), "through": records[-1].seq if records else 0},
            created_at=now, expires_at=now + int(self.ttl_s * 1000), report=done.runs, image=done.image,
        )

    async def at_dead_letter(
        self, instance_id: str, qid: int, correction: dict[str, Any] | None = None, *, app: App | str | None = None,
    ) -> Fork:
        """A fork through the input a dead letter (queue row ``qid``) left,
        under ``app``, that input corrected by ``correction`` (``{type?,
        payload?, metadata?}``): what the fix would do, before it is
        replayed live (docs/advanced/forks.md#from-the-failures-inbox)."""
        records = await self._records(instance_id, None)
        dead = [r for r in records if r.qid == qid and r.outcome == "dead"]
        if not dead:
            raise errors.InvalidInput(
                f"the dead letter's input (queue row {qid}) is not kept: it was pruned", field="failure"
            )
        seq = dead[-1].seq
        edits = [] if not correction else [{"seq": seq, "action": "replace", **correction}]
        return await self.create(instance_id, upto=seq, app=app, edits=edits)

    async def _application(self, app: App | str | None) -> App:
        if app is None:
            if self._app is None:
                raise errors.InvalidInput(
                    "this process runs no application: give the fork's app (module:attribute)", field="app"
                )
            return self._app
        if isinstance(app, str):
            if self._load_app is None:
                raise errors.InvalidInput("this process cannot load an application by name", field="app")
            return await load_named(self._load_app, app)
        return app

    async def _records(self, instance_id: str, upto: int | None) -> list[InputRecord]:
        records: list[InputRecord] = []
        after = 0
        while True:
            page = await self._kernel.inputs().inputs(self.tenant, instance_id, after=after, upto=upto, limit=PAGE)
            records.extend(page.inputs)
            if page.next_after is None:
                return records
            after = page.next_after

    # --- reading -----------------------------------------------------------------

    async def get(self, fork_id: str) -> Fork:
        return Fork(await self._row(fork_id), self)

    async def _row(self, fork_id: str, *, whole: bool = False) -> ForkRow:
        if not isinstance(fork_id, str) or not 1 <= len(fork_id) <= 200:
            raise errors.ForkNotFound(fork_id=str(fork_id)[:80])
        row = await self._kernel.forks().get(self.tenant, fork_id, now=self._kernel.now_ms(), whole=whole)
        if row is None:
            raise errors.ForkNotFound(fork_id=fork_id)
        return row

    async def list(self, instance_id: str | None = None, *, after: str | None = None, limit: int = 100) -> list[Fork]:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise errors.InvalidInput("limit must be 1-1000", field="limit")
        rows = await self._kernel.forks().list(
            self.tenant, instance_id, after=after, limit=limit, now=self._kernel.now_ms()
        )
        return [Fork(r, self) for r in rows]

    async def runs(self, fork_id: str) -> list[dict[str, Any]]:
        """What each of the fork's runs did: its event, outcome and error,
        its effects (and reads) and what it was refused."""
        return (await self._row(fork_id, whole=True)).report or []

    async def state(self, fork_id: str) -> tuple[Any, int]:
        """The fork's ``ctx.state`` document and version."""
        return await self._on_image(fork_id, lambda db: db.state_get())

    async def query(
        self, fork_id: str, sql: str, params: Sequence[Any] = (), *, max_rows: int = 500, timeout_s: float = 2.0,
    ) -> QueryResult:
        """One read-only statement on the fork's database, as ``instances.query``."""
        check_query(params, max_rows, timeout_s)
        return await self._on_image(
            fork_id, lambda db: db.read_only(sql, params, max_rows=max_rows, timeout_s=float(timeout_s))
        )

    async def _on_image(self, fork_id: str, work: Callable[[InstanceDatabase], Any]) -> Any:
        image = (await self._row(fork_id, whole=True)).image or b""
        databases = StateDatabases(SandboxStorage(image), threads=1, clock=self._kernel.clock)
        try:
            return await work(databases.get(self.tenant, fork_id))
        finally:
            await databases.close()

    async def discard(self, fork_id: str) -> Fork:
        """Delete the fork; what it was."""
        row = await self._row(fork_id)
        if not await self._kernel.forks().delete(self.tenant, fork_id):
            raise errors.ForkNotFound(fork_id=fork_id)
        return Fork(row, self)

    # --- comparing ---------------------------------------------------------------

    async def _live_at(self, fork: ForkRow, records: list[InputRecord]) -> bytes:
        """The live instance's database where the fork stopped (its input
        ``through``): as it is now while no input came after that one; else
        as the inputs through it left it, replayed unedited under the
        runtime's application (the live history's own code) in a sandbox."""
        through = records[-1].seq if records else 0

        async def later() -> bool:
            page = await self._kernel.inputs().inputs(self.tenant, fork.instance_id, after=through, limit=1)
            return bool(page.inputs)

        if not await later():
            image = await self._live_image(fork.instance_id)
            if not await later():  # no run ended while the image was read
                return image
        if self._app is None:
            raise errors.InvalidInput(
                "this process runs no application to replay the live history to the fork's last input with",
                field="fork",
            )
        instance = await self._instance(fork.instance_id)
        return (await replay(self._kernel, self._app, instance, edited(records, [], self._kernel.now_ms()))).image

    async def diff(self, fork_id: str, against: str | None = None) -> dict[str, Any]:
        """The fork against the live instance (``against`` None) or another
        fork: state, tables, and per input the effects and outcomes.
        ``changed``: anything differs. ``nondeterministic``: a fork with
        no edits, under the code that ran every input it replayed, differs
        from the live instance, so the handler read something outside ctx."""
        fork = await self._row(fork_id, whole=True)
        other = None
        if against is not None:
            other = await self._row(against, whole=True)
            if other.instance_id != fork.instance_id:
                raise errors.InvalidInput("a fork compares with a fork of the same instance", field="against")
        return await self._compare(fork, other)

    async def _compare(self, fork: ForkRow, other: ForkRow | None, *, after: int = 0) -> dict[str, Any]:
        """``fork`` against ``other`` (None: the live instance); runs of
        inputs after ``after`` only."""
        fork_runs = _by_input(fork.report or [], after)
        if other is None:
            # The live history up to the input the fork replayed last: inputs
            # kept since it was made are not differences.
            records = await self._records(fork.instance_id, fork.summary.get("through", 0))
            other_image = await self._live_at(fork, records)
            skipped = superseded(records)
            other_runs = {
                r.seq: {"outcome": "failed" if r.outcome == "dead" else "done", "error": r.error,
                        "effects": effects_of((r.tape or {}).get("ops", []))}
                for r in records if r.seq > after and r.seq not in skipped
            }
            versions = {r.code_version for r in records}
        else:
            other_runs, other_image, versions = _by_input(other.report or [], after), other.image or b"", set()
        d = diff_images(other_image, fork.image or b"")
        effects, outcomes = diff_runs(other_runs, fork_runs)
        changed = bool(d["state"]["added"] or d["state"]["removed"] or d["state"]["changed"] or d["tables"]
                       or effects or outcomes)
        same_code = fork.app is None and versions <= {self._code_version(fork.actor)}
        return {
            "fork_id": fork.fork_id, "against": "live" if other is None else other.fork_id,
            "instance_id": fork.instance_id, "changed": changed,
            "nondeterministic": changed and other is None and not fork.edits and same_code,
            "state": d["state"], "tables": d["tables"], "effects": effects, "outcomes": outcomes,
        }

    def _code_version(self, actor: str) -> str | None:
        """The version of the runtime's code for ``actor``, as its runs keep it."""
        definition = None if self._app is None else self._app.actors.get(actor)
        if definition is None:
            return None
        return (self._kernel.settings.deploy_version or self._app.version  # type: ignore[union-attr]
                or self._reload_version() or code_of(definition))

    async def check(
        self, instance_id: str, candidate: App, *, current: App | None = None, inputs: int = 1000,
    ) -> dict[str, Any]:
        """The deploy check of one instance (deploy_check.py): its history
        replayed under ``candidate`` against the same under ``current`` (None:
        against the live instance, which the deployed code made), neither
        kept; runs compared over the last ``inputs`` inputs, state and tables
        at the end. ``first_input``: the first input whose runs differ."""
        fork = await self._replayed(instance_id, None, candidate, None)
        other = None if current is None else await self._replayed(instance_id, None, current, None)
        through = fork.summary["through"]
        d = await self._compare(fork, other, after=max(through - inputs, 0))
        differing = sorted(x["seq"] for x in (*d["effects"], *d["outcomes"]) if isinstance(x["seq"], int))
        return {
            "instance_id": instance_id, "key": fork.key, "inputs": through, "diverged": d["changed"],
            "first_input": differing[0] if differing else None,
            "state_differs": bool(d["state"]["added"] or d["state"]["removed"] or d["state"]["changed"] or d["tables"]),
            "diff": {k: d[k] for k in ("state", "tables", "effects", "outcomes")},
        }


def _by_input(runs: list[dict[str, Any]], after: int = 0) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for r in runs:
        if r["seq"] is not None and r["seq"] <= after:
            continue
        out[r["seq"] if r["seq"] is not None else r["label"]] = {
            "outcome": r["outcome"], "error": r["error"], "effects": effects_of(r["ops"]),
        }
    return out
