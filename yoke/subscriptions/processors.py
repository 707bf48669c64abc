"""Stream processors: durable folds of a source stream.

A processor registered with ``@app.processor(name)`` has ``initial_state()``,
a pure ``reduce(state, event) -> state`` and optionally
``async after(state, events, ctx)`` for effects, plus a ``version``. Its
checkpoint (offset and state, for one version and one source lifetime) is
saved with the cursor in one transaction. When the version changes or the
checkpoint is missing, the state is rebuilt by replaying the stream through
the cursor in pages (``after`` is not run for replayed events); each page's
progress is saved, so an interrupted rebuild resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .. import errors
from ..clock import Clock, wall_ms
from ..events import json_bytes
from ..routing.filters import Filter
from ..store.subscriptions import Checkpoint

if TYPE_CHECKING:
    from ..routing.evaluation import Evaluations
    from ..store import Store
    from .batch import Batch

REBUILD_PAGE = 500


@dataclass(frozen=True)
class ProcessorContext:
    """What ``after`` gets: the runtime, the source stream and the names, and
    the run that delivered the batch: the source lifetime (``stream_id``,
    ``stream_created_at``) and the configuration ``generation``."""

    runtime: Any  # the public runtime (yoke.open's), for the application's code
    stream: Any  # the source's Stream handle
    name: str
    processor: str
    stream_id: str = ""
    stream_created_at: int = 0
    generation: int = 0


def version_of(definition: Any) -> str:
    return str(getattr(definition, "version", "1"))


class Superseded(Exception):
    """The subscription moved to another run while its state was rebuilt."""


def current(checkpoint: Checkpoint | None, definition: Any, stream_id: str, generation: int) -> bool:
    """Does ``checkpoint`` belong to this version, source lifetime and run?"""
    return (
        checkpoint is not None and checkpoint.version == version_of(definition)
        and checkpoint.stream_id == stream_id and checkpoint.generation == generation
    )


def json_state(state: Any, name: str) -> Any:
    """The state as it will be stored (a state that is not JSON fails the delivery)."""
    try:
        json_bytes(state, "state")
    except errors.InvalidInput as exc:
        raise errors.InvalidInput(f"processor {name!r} returned a state that is not JSON: {exc.message}") from None
    return state


async def rebuild(
    store: Store, evaluations: Evaluations, definition: Any, tenant: str, path: str, name: str, stream_id: str,
    generation: int, through: int, event_filter: Filter | None, checkpoint: Checkpoint | None, *, clock: Clock,
) -> Checkpoint:
    """Fold the stream's durable events up to ``through`` into a complete
    checkpoint, resuming an unfinished rebuild of the same version, source
    and run (its progress saved at ``clock``'s times). ``Superseded`` when
    the run changes meanwhile."""
    version = version_of(definition)
    if (
        current(checkpoint, definition, stream_id, generation) and not checkpoint.complete
        and checkpoint.through <= through
    ):
        state, done = checkpoint.state, checkpoint.through
    else:
        state, done = definition.initial_state(), 0
    while done < through:
        page = await store.read(tenant, path, done, REBUILD_PAGE)
        events = [e for e in page.events if e.offset <= through]
        kept = events if event_filter is None else await evaluations.select(tenant, event_filter, events)
        for event in kept:
            state = definition.reduce(state, event)
        done = events[-1].offset if events else through
        if len(events) < REBUILD_PAGE:
            done = through
        progress = Checkpoint(
            tenant, path, name, version, stream_id, generation, done, json_state(state, name),
            done >= through,
        )
        if not await store.subscriptions.save_checkpoint(progress, wall_ms(clock)):
            raise Superseded(f"{path} {name!r} left run {generation} during its rebuild")
    return Checkpoint(tenant, path, name, version, stream_id, generation, through, state, True)


async def fold(
    batch: Batch, processor: str, definition: Any, checkpoint: Checkpoint, *,
    open_stream: Callable[[str, str], Any], application: Any,
) -> Checkpoint:
    """Reduce the batch onto the checkpoint and run ``after`` (its ``ctx``:
    ``application`` and the source's handle, by ``open_stream(path,
    tenant)``); the caller saves the result together with the cursor."""
    state = checkpoint.state
    for event in batch.events:
        state = definition.reduce(state, event)
    after = getattr(definition, "after", None)
    json_state(state, processor)
    if after is not None:
        ctx = ProcessorContext(
            application, open_stream(batch.path, batch.tenant), batch.name, processor,
            batch.stream_id, batch.created_at, batch.generation,
        )
        await after(state, list(batch.events), ctx)
    last = batch.events[-1].offset if batch.events else checkpoint.through
    return replace(checkpoint, through=last, state=state, complete=True)


def lookup(processors: Mapping[str, Any], name: str) -> Any:
    definition = processors.get(name)
    if definition is None:
        raise errors.InvalidInput(f"no processor named {name!r} is registered in the application")
    return definition
