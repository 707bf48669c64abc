#!/usr/bin/env python
"""Ephemeral append benchmark: presence-style events across many streams,
with the in-memory buffer full, so that every append evicts.

(a) buffer layer: prepared events added straight to ``EphemeralBuffers``
    as the appender adds them after a commit, round-robin over ``--streams``
    streams of ``--tenants`` tenants, after a warm-up that fills the
    buffers; each add then evicts (by the process cap when the build has
    one, else by the per-stream budget). Adds per CPU second (best of 3
    rounds), and the buffered bytes at the end. (Runs against an older build too, for a before/after figure.)
(c) reads: a tail's read (the newest 10) and a backfill (1000 events)
    merged from one stream's buffer holding 2,000. Reads per CPU second.
(b) through the public API on each backend (``yoke.open``,
    ``stream.append_many``): 64 producers appending batches of 100
    ephemeral events to streams picked round-robin over ``--streams``;
    events/s. Ephemeral appends still commit (the offset is taken in the
    store), so this figure is bounded by the store; (a) isolates the buffer.

(d) across processes (PostgreSQL): two ``yoke serve`` processes on one
    database; ``--tails`` SSE tails on server B, one per stream, while a
    client appends to server A, round-robin over those streams, ``--events``
    events at ``--rate`` per second (every tenth one durable). Each event
    carries its send time (CLOCK_MONOTONIC, shared by the processes of the
    machine); the tails record the delay from the append call being made to
    the event arriving on B, and check that each stream's events arrive in
    offset order with none missing. p50 / p99 / max, ephemeral and durable.

The caps are set low (per stream 16 KiB, per tenant 1 MiB, per process
2 MiB) so eviction runs from the start. The last line printed is one JSON
object with every figure.

    python bench/ephemeral.py [--backend all|postgres|sqlite|none] [--streams 1000] [--quick]
                              [--tails 8] [--events 4000] [--rate 400]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yoke  # noqa: E402
from yoke.config import Settings  # noqa: E402
from yoke.events import prepare  # noqa: E402
from yoke.streams.ephemeral import EphemeralBuffers  # noqa: E402
from yoke.store.contract import ReadPage  # noqa: E402

from append import scratch  # noqa: E402

STREAM_BYTES = 16 * 1024
TENANT_BYTES = 1024 * 1024
PROCESS_BYTES = 2 * 1024 * 1024
CAPS = {
    "ephemeral_buffer_bytes": STREAM_BYTES,
    "ephemeral_tenant_bytes": TENANT_BYTES,
    "ephemeral_process_bytes": PROCESS_BYTES,
}


def caps() -> dict[str, int]:
    """The cap settings this build knows (a build before the per-tenant and
    per-process caps has only the per-stream budget)."""
    known = {f.name for f in dataclasses.fields(Settings)}
    return {k: v for k, v in CAPS.items() if k in known}


def new_event(i: int) -> dict[str, Any]:
    return {"type": "presence", "payload": {"user": f"u{i % 5000}", "state": "typing"}, "ephemeral": True}


def say(backend: str, label: str, value: str) -> None:
    print(f"{backend:<8} {label:<62} {value}", flush=True)


def make_buffers() -> EphemeralBuffers:
    settings = caps()
    try:
        return EphemeralBuffers.from_settings(Settings(**settings))  # type: ignore[attr-defined]
    except AttributeError:
        return EphemeralBuffers(settings["ephemeral_buffer_bytes"])


def buffer_layer(streams: int, tenants: int, adds: int) -> dict[str, float]:
    """What the appender does per ephemeral event after the commit, timed
    alone: buffer it (and evict). The build before the caps decoded each
    event into an ``Event`` first and added that; this one keeps the
    prepared texts and decodes on read."""
    buffers = make_buffers()
    keys = [(f"t{s % tenants}", f"/room/{s}") for s in range(streams)]
    pool = [prepare(new_event(i)) for i in range(1000)]
    offsets = [0] * streams
    before_caps = not hasattr(EphemeralBuffers, "from_settings")

    def run(count: int, start: int) -> None:
        for i in range(start, start + count):
            s = i % streams
            tenant, path = keys[s]
            p = pool[i % 1000]
            offsets[s] += 1
            if before_caps:
                buffers.ensure(tenant, path).add(p.to_event(tenant, path, offsets[s], 0), p.size)
            else:
                buffers.ensure(tenant, path).add(p, offsets[s], 0)

    run(adds // 4, 0)  # fill the buffers: from here on every add evicts
    # CPU time, best of 3 rounds: the loop is pure CPU, and the machine is shared.
    elapsed = float("inf")
    for round_ in range(3):
        started = time.process_time()
        run(adds // 3, adds // 4 + round_ * (adds // 3))
        elapsed = min(elapsed, (time.process_time() - started) * 3)
    buffered = getattr(buffers, "bytes", None)
    if before_caps:
        buffered = sum(b.bytes for b in buffers._buffers.values())
    return {"adds_per_s": round(adds / elapsed), "buffered_bytes": buffered, "buffers": len(buffers._buffers)}


def read_layer(reads: int) -> dict[str, float]:
    """Merging buffered events into reads of one stream holding 2,000 of
    them: a live tail's read (the newest 10) and a backfill (the first 1000).
    The build before the caps kept decoded events and scanned the whole
    buffer per read; this one scans from the newest end and decodes what it
    returns. Reads per CPU second."""
    buffers = make_buffers_for_reads()
    before_caps = not hasattr(EphemeralBuffers, "from_settings")
    buffer = buffers.ensure("t", "/room")
    head = 0
    for i in range(2000):
        p = prepare(new_event(i))
        head += 1
        if before_caps:
            buffer.add(p.to_event("t", "/room", head, 0), p.size)
        else:
            buffer.add(p, head, 0)
    figures = {"buffered_events": len(buffer._events if before_caps else buffer)}
    for label, after, limit in (("tail_reads_per_s", head - 10, 1000), ("backfill_reads_per_s", 0, 1000)):
        started = time.process_time()
        for _ in range(reads):
            if hasattr(buffer, "merge_page"):  # pages capped by bytes too
                merged = buffer.merge_page(ReadPage(True, head, 0, []), after, limit).events
            else:
                merged = buffer.merge([], head, after, limit)
        figures[label] = round(reads / (time.process_time() - started))
        assert len(merged) == min(head - after, limit, figures["buffered_events"])
    return figures


def make_buffers_for_reads() -> EphemeralBuffers:
    if hasattr(EphemeralBuffers, "from_settings"):
        return EphemeralBuffers(1 << 30, 1 << 30, 1 << 30)
    return EphemeralBuffers(1 << 30)


async def through_api(url: str, streams: int, producers: int, batches: int, batch: int) -> float:
    async with yoke.open(url, **caps()) as y:
        handles = [y.stream(f"/room/{s}", tenant="bench") for s in range(streams)]
        # Create the stream rows outside the timing.
        for chunk in range(0, streams, 100):
            await asyncio.gather(*(h.append(new_event(0)) for h in handles[chunk : chunk + 100]))

        async def producer(p: int) -> None:
            for i in range(batches):
                stream = handles[(p * batches + i) % streams]
                await stream.append_many([new_event(p * 7 + j) for j in range(batch)])

        started = time.perf_counter()
        await asyncio.gather(*(producer(p) for p in range(producers)))
        return producers * batches * batch / (time.perf_counter() - started)


async def across_processes(url: str, tails: int, events: int, rate: float) -> dict[str, Any]:
    """(d): append on one ``yoke serve``, tail on another."""
    from http_api import percentile, start_server, stop_server

    with tempfile.TemporaryDirectory(prefix="yoke_bench_") as folder:
        for name in ("a", "b"):
            Path(folder, name).mkdir()
        a = start_server(url, Path(folder, "a"))
        b = start_server(url, Path(folder, "b"))
        try:
            return await _across(a, b, tails, events, rate, percentile)
        finally:
            stop_server(a)
            stop_server(b)


async def _across(a: Any, b: Any, tails: int, events: int, rate: float, percentile: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {a.token}"}
    paths = [f"/across/{i}" for i in range(tails)]
    delays: dict[bool, list[float]] = {True: [], False: []}
    arrivals: dict[int, int] = {}  # event n -> when it arrived on B
    answered: dict[int, int] = {}  # event n -> when A's answer to its append arrived
    per_stream = [len(range(i, events, tails)) for i in range(tails)]
    problems: list[str] = []
    ready = [asyncio.Event() for _ in paths]

    async def tail(i: int) -> None:
        expected = 1
        async with httpx.AsyncClient(base_url=b.url, headers=headers, timeout=None) as client:
            async with client.stream("GET", f"/v1/streams{paths[i]}/-/tail", params={"after": 0}) as response:
                ready[i].set()
                count = 0
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    arrived = time.monotonic_ns()
                    event = orjson.loads(line[5:])
                    if event["offset"] != expected:
                        problems.append(f"{paths[i]}: offset {event['offset']}, expected {expected}")
                    expected = event["offset"] + 1
                    delays[event["ephemeral"]].append((arrived - event["payload"]["sent"]) / 1e6)
                    arrivals[event["payload"]["n"]] = arrived
                    count += 1
                    if count == per_stream[i]:
                        return

    async with httpx.AsyncClient(base_url=a.url, headers=headers, timeout=30) as producer:
        for path in paths:  # create the streams (first offset 1 is the first measured event)
            (await producer.put(f"/v1/streams{path}", json={})).raise_for_status()
        readers = [asyncio.create_task(tail(i)) for i in range(tails)]
        await asyncio.gather(*(r.wait() for r in ready))
        await asyncio.sleep(0.5)  # the tails' first (empty) reads are done
        started = time.perf_counter()
        for n in range(events):
            pause = started + n / rate - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            body = {"type": "tok", "payload": {"sent": time.monotonic_ns(), "n": n}, "ephemeral": n % 10 != 0}
            (await producer.post(f"/v1/streams{paths[n % tails]}/-/events", json=body)).raise_for_status()
            answered[n] = time.monotonic_ns()
        elapsed = time.perf_counter() - started
        await asyncio.wait_for(asyncio.gather(*readers), 60)
    figures: dict[str, Any] = {"events": events, "tails": tails, "rate": round(events / elapsed)}
    for ephemeral, label in ((True, "ephemeral"), (False, "durable")):
        values = sorted(delays[ephemeral])
        figures[label] = {
            "count": len(values),
            "p50_ms": round(percentile(values, 0.5), 2),
            "p99_ms": round(percentile(values, 0.99), 2),
            "max_ms": round(values[-1], 2) if values else None,
        }
    # From A's answer: the relay and B's tail alone (negative: B had it first).
    after_answer = sorted((arrivals[n] - answered[n]) / 1e6 for n in arrivals if n % 10 != 0)
    figures["ephemeral_after_answer"] = {
        "p50_ms": round(percentile(after_answer, 0.5), 2), "p99_ms": round(percentile(after_answer, 0.99), 2),
    }
    figures["problems"] = problems[:10]
    return figures


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("all", "postgres", "sqlite", "none"), default="all")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tails", type=int, default=8)
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=400)
    args = parser.parse_args(argv)
    adds = 100_000 if args.quick else 1_000_000
    batches = 5 if args.quick else 30

    results: dict[str, Any] = {"caps": caps()}
    layer = buffer_layer(args.streams, args.tenants, adds)
    label = f"(a) buffer layer, {args.streams} streams / {args.tenants} tenants"
    say("memory", label, f"{layer['adds_per_s']:,} adds/s")
    say("memory", "(a) buffered bytes after the run", f"{layer['buffered_bytes']:,} in {layer['buffers']} buffers")
    results["buffer_layer"] = layer
    reads = read_layer(2000 if args.quick else 10_000)
    label = f"(c) reads merging {reads['buffered_events']} buffered events: tail / backfill"
    say("memory", label, f"{reads['tail_reads_per_s']:,} / {reads['backfill_reads_per_s']:,} reads/s")
    results["read_layer"] = reads
    backends = ("postgres", "sqlite") if args.backend == "all" else () if args.backend == "none" else (args.backend,)
    for backend in backends:
        async with scratch(backend) as (url, _):
            eps = await through_api(url, args.streams, 64, batches, 100)
        say(backend, f"(b) 64 producers, batches of 100, {args.streams} streams", f"{eps:,.0f} events/s")
        results[backend] = {"api_eps": round(eps)}
        if backend == "postgres":
            async with scratch(backend) as (url, _):
                across = await across_processes(url, args.tails, args.events // (4 if args.quick else 1), args.rate)
            for label in ("ephemeral", "durable"):
                f = across[label]
                say(backend, f"(d) append on A, tail on B: {label} ({f['count']} at {across['rate']}/s)",
                    f"p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms, max {f['max_ms']} ms")
            f = across["ephemeral_after_answer"]
            say(backend, "(d) the same, ephemeral, from A's answer to the append",
                f"p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms")
            if across["problems"]:
                say(backend, "(d) ORDER PROBLEMS", "; ".join(across["problems"]))
            results[backend]["across"] = across
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
