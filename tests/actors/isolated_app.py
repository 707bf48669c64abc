"""An application whose actors run in host processes (tests/actors/test_isolation.py).

``worker`` does what the event's payload says, so one actor covers every
way a handler can end: return, raise, exit, crash, hang, spin, allocate."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import sys
import threading

from yoke import App, Filter

app = App()


async def misbehave(what: str | None) -> None:
    if what == "raise":
        raise ValueError("asked to fail")
    if what == "exit":
        os._exit(7)
    if what == "segfault":
        ctypes.string_at(0)
    if what == "kill":
        os.kill(os.getpid(), 9)
    if what == "hang":
        await asyncio.Event().wait()  # hangs until its host is killed
    if what == "spin":
        while True:
            pass
    if what == "sleep":
        threading.Event().wait()  # blocks the host's loop until it is killed
    if what == "allocate":
        hoard = []
        while True:
            hoard.append(bytearray(16 * 2**20))


async def count(ctx, event) -> None:
    await ctx.state.update(lambda s: {**s, "done": s.get("done", 0) + 1, "pid": os.getpid()})
    await ctx.append({"type": "done", "payload": {"key": ctx.instance.key, "attempt": ctx.attempt}})


# Instances are made with their own filters (the test decides who gets what).
@app.actor("worker", isolation="process", timeout_s=3, max_attempts=2, retry_base_s=0.05, retry_max_s=0.1)
async def worker(ctx, event):
    await misbehave(event.payload.get("what"))
    await count(ctx, event)


@app.actor("grower", isolation="process", timeout_s=60, max_attempts=2, retry_base_s=0.05, retry_max_s=0.1)
async def grower(ctx, event):
    """Like worker, with time to fill its memory on a loaded machine."""
    await misbehave(event.payload.get("what"))
    await count(ctx, event)


@app.actor("patient", isolation="process", timeout_s=120, max_attempts=1)
async def patient(ctx, event):
    await misbehave(event.payload.get("what"))
    await count(ctx, event)


@app.actor("echo", filter=Filter(types=["echo"]), isolation="process", timeout_s=30)
async def echo(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (n INTEGER)")
    await ctx.sqlite.exec("INSERT INTO seen VALUES (?)", [event.payload.get("n", 0)])
    rows = await ctx.sqlite.query("SELECT count(*) AS c FROM seen")
    await ctx.state.set({"count": rows[0]["c"], "pid": os.getpid(), "attempt": ctx.attempt})
    await ctx.append({"type": "echoed", "payload": {"n": event.payload.get("n")}}, stream="/out")


@app.actor("plain", filter=Filter(types=["plain"]))
async def plain(ctx, event):
    """No isolation of its own: the worker's default decides."""
    await ctx.state.set({"pid": os.getpid()})
    if event.payload and event.payload.get("out"):
        await ctx.append({"type": "plain.ran", "payload": {"pid": os.getpid()}}, stream="/plain-out")


# Kernel-side objects that must not be reachable from a host.
FORBIDDEN = ("Runtime", "SqliteStore", "PostgresStore", "OpHandler", "Connection", "Pool",
             "StateDatabases", "AppendService", "Executor", "Scheduler")
FORBIDDEN_MODULES = ("yoke.runtime", "yoke.store.sqlite", "yoke.store.postgres", "asyncpg", "sqlite3")


def kernel_object(obj) -> str | None:
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    if module.startswith(FORBIDDEN_MODULES) and cls.__name__ in FORBIDDEN + ("Store",):
        return f"{module}.{cls.__name__}"
    if module.startswith(("yoke.runtime", "yoke.actors.ops", "yoke.store.sqlite", "yoke.store.postgres",
                          "asyncpg", "sqlite3")) and not isinstance(obj, type):
        return f"{module}.{cls.__name__}"
    return None


def walk(roots, limit: int = 500_000) -> tuple[int, list[str]]:
    """Everything reachable from ``roots`` through attributes and gc
    referents, the way an attacker would look for a way out."""
    seen: set[int] = set()
    todo = list(roots)
    found: list[str] = []
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        hit = kernel_object(obj)
        if hit is not None:
            found.append(hit)
        todo.extend(gc.get_referents(obj))
        for name in dir(obj) if not isinstance(obj, (str, bytes, int, float)) else ():
            try:
                todo.append(getattr(obj, name))
            except Exception:
                pass
    return len(seen), found


@app.actor("snoop", filter=Filter(types=["snoop"]), isolation="process", timeout_s=120)
async def snoop(ctx, event):
    reached, found = walk([ctx, event, ctx.ops, ctx.state, ctx.sqlite, ctx.schedules, ctx.portals,
                           ctx.instances, ctx.conversations, ctx.instance])
    everywhere = sorted({h for h in map(kernel_object, gc.get_objects()) if h})
    refused = {}
    for op in ("stream_read", "read", "stream_tail", "store", "tail"):
        try:
            await ctx.ops.call(op, {"stream": "/"})
            refused[op] = "answered"
        except Exception as exc:
            refused[op] = getattr(exc, "code", type(exc).__name__)
    await ctx.state.set({
        "reached": reached, "found": sorted(set(found)), "everywhere": everywhere, "refused": refused,
        "modules": sorted(m for m in sys.modules if m.startswith(FORBIDDEN_MODULES)),
        "env": sorted(k for k in os.environ if k.startswith(("YOKE_", "PG"))),
        "pid": os.getpid(),
    })


@app.actor("journaled", isolation="process", timeout_s=10, max_attempts=3, retry_base_s=0.01, retry_max_s=0.05)
async def journaled(ctx, event):
    """The same effects on every attempt, one that carries the attempt, and
    a failure on the first (tests/actors/test_effects_journal.py)."""
    await ctx.append({"type": "same", "payload": {"n": event.payload["n"]}}, stream="/journal")
    await ctx.append({"type": "tried", "payload": {"attempt": ctx.attempt}}, stream="/journal")
    await ctx.schedules.upsert("later", event={"type": "later"}, after_s=3600)
    child = await ctx.instances.create("worker")
    await ctx.append({"type": "key", "payload": {"key": ctx.idempotency_key("pay"), "child": child["id"]}},
                     stream=f"/keys/{ctx.attempt}")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its effects")


@app.actor("atomic_counter", isolation="process", effects="atomic", timeout_s=10, max_attempts=3,
           retry_base_s=0.01, retry_max_s=0.05)
async def atomic_counter(ctx, event):
    """An atomic run in a host: the first attempt's writes and append vanish
    with its failure (tests/actors/test_effects_atomic.py)."""
    await ctx.state.update(lambda s: {**s, "count": s.get("count", 0) + 1})
    seen = await ctx.state.get()
    await ctx.append({"type": "counted", "payload": {"seen": seen, "attempt": ctx.attempt}}, stream="/atomic")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its effects")
