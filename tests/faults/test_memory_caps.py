"""Bounded memory: ephemeral buffers under per-stream, per-tenant and
per-process caps, and the other per-stream / per-connection structures
(appenders, wake-up waiters, shared reads, blocked producers, the token
cache, the SSE frame cache, the fan-out cursor and instance caches) freed
or capped. docs/production/memory.md describes them."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections import defaultdict, deque

import orjson
import pytest

import yoke
from yoke import errors
from yoke.events import prepare
from yoke.http.auth import TokenCache
from yoke.http.sse import FrameCache
from yoke.store.contract import Limits, TokenInfo
from yoke.streams.ephemeral import EVENT_OVERHEAD, STREAM_OVERHEAD, EphemeralBuffers

KIB = 1024


def presence(i: int, pad: int = 200) -> dict:
    return {"type": "presence", "payload": {"user": f"u{i}", "pad": "x" * pad}, "ephemeral": True}


async def ephemeral_offsets(y: yoke.Runtime, tenant: str, path: str) -> list[int]:
    """The ephemeral offsets a reader of the stream still gets."""
    events = await y.stream(path, tenant=tenant).read(include_ephemeral=True, limit=10_000)
    return [e.offset for e in events if e.ephemeral]


def check_accounting(buffers: EphemeralBuffers) -> None:
    """The charged totals add up, no empty buffer is kept, the heaps hold
    every stream with events and not much else."""
    per_tenant: dict[str, int] = defaultdict(int)
    for (tenant, _), buffer in buffers._buffers.items():
        assert len(buffer) > 0, "an empty buffer was kept"
        per_tenant[tenant] += buffer.bytes + STREAM_OVERHEAD
        assert buffer.bytes <= buffers.stream_bytes
    assert buffers.tenants() == dict(per_tenant)
    assert buffers.bytes == sum(per_tenant.values()) <= buffers.process_bytes
    assert all(b <= buffers.tenant_bytes for b in per_tenant.values())
    assert buffers.events == sum(len(b) for b in buffers._buffers.values())
    assert len(buffers._heap) <= 2 * len(buffers) + 64
    assert {id(b) for _, b in buffers._heap} >= {id(b) for b in buffers._buffers.values()}


# --- the caps, through the public API on both backends ------------------------


async def test_process_cap_evicts_the_oldest_across_streams_and_tenants(db_url, tenant):
    cap = 96 * KIB
    async with yoke.open(
        db_url, ephemeral_buffer_bytes=64 * KIB, ephemeral_tenant_bytes=1 << 30, ephemeral_process_bytes=cap
    ) as y:
        tenants = [f"{tenant}{i}" for i in range(3)]
        order: list[tuple[str, str, int]] = []
        for i in range(450):
            t, path = tenants[i % 3], f"/room/{i % 40}"
            result = await y.stream(path, tenant=t).append(presence(i))
            order.append((t, path, result.offset))
            assert y.buffers.bytes <= cap
        check_accounting(y.buffers)
        survivors = {
            (t, f"/room/{r}", offset)
            for t in tenants
            for r in range(40)
            for offset in await ephemeral_offsets(y, t, f"/room/{r}")
        }
        # Exactly the newest survive: everything evicted is older than
        # everything kept, whichever stream or tenant it belonged to.
        assert 20 < len(survivors) < 200
        assert survivors == set(order[-len(survivors):])
        assert y.buffers.evicted["process"] == 450 - len(survivors)
        assert y.buffers.evicted["tenant"] == y.buffers.evicted["stream"] == 0
        t, path, offset = order[-1]
        assert (await y.stream(path, tenant=t).get(offset)).payload["user"] == "u449"


async def test_tenant_cap_evicts_only_that_tenants_oldest(db_url, tenant):
    cap = 48 * KIB
    async with yoke.open(
        db_url, ephemeral_buffer_bytes=32 * KIB, ephemeral_tenant_bytes=cap, ephemeral_process_bytes=1 << 30
    ) as y:
        quiet, noisy = tenant + "q", tenant + "n"
        # The quiet tenant's events are the oldest in the process.
        for i in range(10):
            await y.stream(f"/q/{i % 2}", tenant=quiet).append(presence(i))
        quiet_usage = y.buffers.tenant_usage(quiet)
        order = []
        for i in range(300):
            path = f"/n/{i % 30}"
            order.append((path, (await y.stream(path, tenant=noisy).append(presence(i))).offset))
            assert y.buffers.tenant_usage(noisy) <= cap
        check_accounting(y.buffers)
        assert y.buffers.tenant_usage(quiet) == quiet_usage
        assert [len(await ephemeral_offsets(y, quiet, f"/q/{i}")) for i in range(2)] == [5, 5]
        kept = {(f"/n/{r}", o) for r in range(30) for o in await ephemeral_offsets(y, noisy, f"/n/{r}")}
        assert 10 < len(kept) < 100 and kept == set(order[-len(kept):])
        assert y.buffers.evicted["tenant"] == 300 - len(kept)


async def test_every_cap_holds_under_mixed_pressure(db_url, tenant):
    # All three caps bind at some point: one hot stream, a noisy tenant and
    # many small ones sharing a process cap below the sum of the tenant caps.
    caps = dict(ephemeral_buffer_bytes=8 * KIB, ephemeral_tenant_bytes=24 * KIB, ephemeral_process_bytes=40 * KIB)
    async with yoke.open(db_url, **caps) as y:
        rng = random.Random(7)
        order: dict[tuple[str, str], list[int]] = defaultdict(list)
        t = path = ""
        for i in range(400):
            roll = rng.random()
            if roll < 0.3:
                t, path = tenant + "hot", "/hot"
            elif roll < 0.6:
                t, path = tenant + "hot", f"/s/{rng.randrange(20)}"
            else:
                t, path = f"{tenant}{rng.randrange(6)}", f"/s/{rng.randrange(5)}"
            result = await y.stream(path, tenant=t).append(presence(i, pad=rng.randrange(10, 900)))
            order[(t, path)].append(result.offset)
            assert y.buffers.bytes <= caps["ephemeral_process_bytes"]
            assert max(y.buffers.tenants().values()) <= caps["ephemeral_tenant_bytes"]
        check_accounting(y.buffers)
        assert all(y.buffers.evicted[cap] > 0 for cap in ("stream", "tenant", "process"))
        # The newest event of the process is always readable.
        assert (await ephemeral_offsets(y, t, path))[-1] == order[(t, path)][-1]
        for (t, path), offsets in order.items():
            kept = await ephemeral_offsets(y, t, path)
            assert kept == offsets[len(offsets) - len(kept):]  # a stream keeps its newest


async def test_emptied_buffers_are_freed(db_url, tenant):
    async with yoke.open(db_url, ephemeral_process_bytes=24 * KIB, ephemeral_tenant_bytes=24 * KIB) as y:
        for i in range(300):
            await y.stream(f"/p/{i}", tenant=tenant).append(presence(i))
        check_accounting(y.buffers)
        assert 5 < len(y.buffers) < 30  # only the streams still holding events
        assert all(y.buffers.get(tenant, f"/p/{i}") is None for i in range(200))
        # A refused ephemeral append leaves nothing behind.
        closed = y.stream("/closed", tenant=tenant + "c")
        await closed.append({"type": "x"})
        await closed.close()
        with pytest.raises(errors.StreamClosed):
            await closed.append(presence(0))
        assert y.buffers.get(tenant + "c", "/closed") is None
        assert tenant + "c" not in y.buffers.tenants() and y.buffers.tenant_usage(tenant + "c") == 0


async def test_a_tail_passes_over_evicted_events(db_url, tenant):
    async with yoke.open(db_url, ephemeral_buffer_bytes=4 * KIB) as y:
        s = y.stream("/gap", tenant=tenant)
        await s.append({"type": "durable"})
        tail = s.tail(after=0)
        assert (await anext(tail)).offset == 1
        # The tail is suspended while 2..41 arrive and most are evicted.
        for i in range(40):
            await s.append(presence(i))
        await s.append({"type": "durable"})
        kept = await ephemeral_offsets(y, tenant, "/gap")
        assert 1 < len(kept) < 10 and kept[-1] == 41
        got = []
        while not got or got[-1] != 42:
            got.append((await asyncio.wait_for(anext(tail), 20)).offset)
        assert got == kept + [42]
        await tail.aclose()


async def test_oversized_for_the_tenant_cap_is_refused_before_an_offset(db_url, tenant):
    async with yoke.open(db_url, ephemeral_tenant_bytes=4 * KIB, ephemeral_process_bytes=1 << 20) as y:
        s = y.stream("/big", tenant=tenant)
        await s.append({"type": "durable"})
        assert y.buffers.max_event_size == 4 * KIB - EVENT_OVERHEAD - STREAM_OVERHEAD
        with pytest.raises(errors.EphemeralTooLarge) as exc:
            await s.append(presence(0, pad=4 * KIB))
        assert exc.value.http_status == 413 and exc.value.to_dict()["limit"] == y.buffers.max_event_size
        assert (await s.info()).head == 1
        await s.append(presence(0, pad=1 * KIB))
        assert (await s.info()).head == 2


def test_caps_too_small_for_any_event_are_refused():
    with pytest.raises(errors.InvalidInput):
        EphemeralBuffers(EVENT_OVERHEAD, 1 << 20, 1 << 20)
    with pytest.raises(errors.InvalidInput):
        EphemeralBuffers(1 << 20, STREAM_OVERHEAD + EVENT_OVERHEAD, 1 << 20)


# --- the eviction structure against a plain model ------------------------------


class Model:
    """The caps done the slow, obvious way: every live event in one list,
    in the order they were added."""

    def __init__(self, stream: int, tenant: int, process: int) -> None:
        self.caps = (stream, tenant, process)
        self.live: list[tuple[int, str, str, int]] = []  # (seq, tenant, path, charge)

    def add(self, seq: int, tenant: str, path: str, charge: int) -> None:
        self.live.append((seq, tenant, path, charge))
        stream_cap, tenant_cap, process_cap = self.caps
        self._evict(lambda e: e[1] == tenant and e[2] == path, stream_cap, overhead=False)
        self._evict(lambda e: e[1] == tenant, tenant_cap, overhead=True)
        self._evict(lambda e: True, process_cap, overhead=True)

    def _evict(self, scope, cap: int, *, overhead: bool) -> None:  # noqa: ANN001
        while True:
            events = [e for e in self.live if scope(e)]
            streams = {(e[1], e[2]) for e in events}
            total = sum(e[3] for e in events) + (STREAM_OVERHEAD * len(streams) if overhead else 0)
            if total <= cap:
                return
            self.live.remove(events[0])


def test_eviction_matches_the_model_across_many_streams_and_tenants():
    rng = random.Random(10)
    caps = (6 * KIB, 20 * KIB, 64 * KIB)
    buffers = EphemeralBuffers(*caps)
    model = Model(*caps)
    offsets: dict[tuple[str, str], int] = defaultdict(int)
    seq_of: dict[tuple[str, str, int], int] = {}
    pool = [prepare(presence(i, pad=rng.randrange(0, 1500))) for i in range(50)]

    async def run() -> None:  # begin/end_commit need a running loop
        for seq in range(1, 6001):
            tenant = f"t{min(rng.randrange(12), rng.randrange(12), rng.randrange(12))}"  # t0 busiest
            path = f"/s/{rng.randrange(3 if seq < 3000 else 400)}"  # few streams, then many
            p = pool[rng.randrange(len(pool))]
            offsets[(tenant, path)] += 1
            buffer = buffers.ensure(tenant, path)
            if rng.random() < 0.1:  # the appender's way: inside a commit
                buffer.begin_commit()
                buffer.add(p, offsets[(tenant, path)], 0)
                buffer.end_commit()
            else:
                buffer.add(p, offsets[(tenant, path)], 0)
            seq_of[(tenant, path, offsets[(tenant, path)])] = seq
            model.add(seq, tenant, path, p.size + EVENT_OVERHEAD)
            if seq % 500 == 0:
                check_accounting(buffers)
                have = {
                    seq_of[(t, path, offset)]
                    for (t, path), b in buffers._buffers.items()
                    for offset in b.offsets()
                }
                assert have == {e[0] for e in model.live}

    asyncio.run(run())
    assert all(buffers.evicted[cap] > 0 for cap in ("stream", "tenant", "process")), buffers.evicted


def test_heaps_shed_forgotten_streams():
    # A tenant cycling through ever new streams under the tenant cap leaves
    # forgotten streams in the process heap; the heap does not keep them.
    buffers = EphemeralBuffers(64 * KIB, 8 * KIB, 1 << 30)
    p = prepare(presence(0))
    for i in range(20_000):
        buffers.ensure("t", f"/s/{i}").add(p, 1, 0)
        assert len(buffers._heap) <= 2 * len(buffers) + 64
    check_accounting(buffers)
    assert len(buffers) < 10


# --- a real `yoke serve` -------------------------------------------------------------


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_server_keeps_ephemeral_memory_under_its_caps(db_url, tenant, tmp_path):
    # The report: 30 streams x 10 MiB took `yoke serve` from 68 to
    # 378 MiB. Here ~57 MiB of ephemeral events over 100 streams and two
    # tenants, with a 4 MiB process cap and a 3 MiB tenant cap.
    from tests.http.conftest import start_server, stop_server

    process_cap, tenant_cap = 4 << 20, 3 << 20
    server = start_server(
        db_url, tmp_path / ".yoke",
        YOKE_EPHEMERAL_PROCESS_BYTES=str(process_cap), YOKE_EPHEMERAL_TENANT_BYTES=str(tenant_cap),
    )
    try:
        other = server.new_token(tenant, "read,append")
        with server.client() as admin, server.client(other) as client:
            def batch(i: int) -> list[dict]:
                return [{"type": "p", "payload": {"n": i, "k": k, "pad": "x" * 8000}, "ephemeral": True}
                        for k in range(12)]

            prefix = f"/mem/{tenant}"
            admin.post(f"/v1/streams{prefix}/warm/-/events", json=batch(0))
            before = rss_bytes(server.process.pid)
            for round_ in range(6):
                for s in range(100):
                    http = client if s % 4 == 0 else admin  # the admin's tenant is the busier
                    r = http.post(f"/v1/streams{prefix}/room/{s}/-/events", json=batch(round_ * 100 + s))
                    assert r.status_code == 201, r.text
                scrape = admin.get("/metrics").text
                assert 0 < metric(scrape, "yoke_ephemeral_bytes") <= process_cap
                assert metric(scrape, "yoke_ephemeral_tenant_bytes_max") <= tenant_cap
            grown = rss_bytes(server.process.pid) - before
            assert metric(scrape, 'yoke_ephemeral_evicted_total{cap="tenant"}') > 0
            assert metric(scrape, 'yoke_ephemeral_evicted_total{cap="process"}') > 0
            assert metric(scrape, 'yoke_ephemeral_limit_bytes{scope="process"}') == process_cap
            assert metric(scrape, "yoke_ephemeral_streams") < 100
            # Before the caps this run kept every event: RSS grew by ~40 MiB
            # for 40 MiB sent. Now it holds at most 4 MiB of them.
            assert grown < 24 << 20, f"RSS grew {grown >> 20} MiB"
            # The newest are readable; the oldest are gone.
            newest = admin.get(f"/v1/streams{prefix}/room/99/-/events", params={"include_ephemeral": "true"})
            assert newest.json()["events"][-1]["payload"] == {"n": 599, "k": 11, "pad": "x" * 8000}
            oldest = admin.get(f"/v1/streams{prefix}/room/1/-/events", params={"include_ephemeral": "true"})
            assert all(e["payload"]["n"] > 1 for e in oldest.json()["events"])
    finally:
        stop_server(server)


def test_server_frees_the_tails_of_clients_that_disconnect(db_url, tenant, tmp_path):
    from tests.http.conftest import start_server, stop_server

    server = start_server(db_url, tmp_path / ".yoke")
    try:
        with server.client() as admin:
            idle = admin.get("/metrics").text
            baseline = metric(idle, "yoke_wakeup_waiters")
            with contextlib.ExitStack() as open_tails:
                readers = []  # a reader dropped closes its connection: keep them
                for s in range(30):
                    url = f"/v1/streams/sse/{tenant}/{s}/-/"
                    admin.post(url + "events", json={"type": "x"})
                    response = open_tails.enter_context(admin.stream("GET", url + "tail"))
                    lines = (line for line in response.iter_lines() if line)
                    assert next(lines) == ": tailing"
                    assert next(lines) == "id: 1"  # following: subscribed and read
                    readers.append(lines)
                scrape = admin.get("/metrics").text
                assert metric(scrape, "yoke_wakeup_waiters") == baseline + 30
                assert metric(scrape, "yoke_open_tails") == 30
            # Every connection is closed mid-tail here.
            deadline = time.monotonic() + 20
            while True:
                scrape = admin.get("/metrics").text
                if (metric(scrape, "yoke_wakeup_waiters"), metric(scrape, "yoke_open_tails")) == (baseline, 0):
                    break
                assert time.monotonic() < deadline, "tails of gone clients are still subscribed"
                time.sleep(0.05)  # the poll interval
            assert metric(scrape, "yoke_appenders") == 0
    finally:
        stop_server(server)


def stalled(server, request: str) -> socket.socket:
    """A client that sends ``request`` and never reads: a 4 KiB receive buffer."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"{request} HTTP/1.1\r\nHost: yoke\r\nAuthorization: Bearer {server.token}\r\n\r\n".encode())
    return sock


def test_stalled_tails_and_reads_hold_a_page_each_not_the_stream(db_url, tenant, tmp_path):
    # The review's report: a stream of 1000 x 60 KB events and 15 tails that
    # never read took `yoke serve` from 74 to 2823 MiB (each tail built its
    # 1000-event page, 60 MB, and wrote it into its socket's buffer at once);
    # a read with limit=10000 did the same once. Now pages end at PAGE_BYTES
    # and SSE frames are written a chunk at a time, waiting for the client.
    from httpx_sse import connect_sse

    from tests.http.conftest import start_server, stop_server
    from yoke.http.sse import CHUNK

    server = start_server(db_url, tmp_path / ".yoke", YOKE_MAX_EVENT_BYTES=str(256 * KIB))
    path = f"/stalled/{tenant}"
    url = f"/v1/streams{path}/-/"
    # 1000 events, ~64 MB: most of 60 KB, every 50th of 200 KB (a frame of several chunks)
    payloads = [f"{i}:" + "x" * (200_000 if i % 50 == 7 else 60_000) for i in range(1000)]
    assert 200_000 > 3 * CHUNK
    sockets: list[socket.socket] = []
    try:
        with server.client() as admin:
            for start in range(0, 1000, 40):
                batch = [{"type": "big", "payload": p} for p in payloads[start:start + 40]]
                assert admin.post(url + "events", json=batch).status_code == 201
            assert len(admin.get(url + "events", params={"limit": 3}).json()["events"]) == 3
            before = rss_bytes(server.process.pid)
            for after in range(10):
                sockets.append(stalled(server, f"GET {url}tail?after={after}"))
            for after in range(2):
                sockets.append(stalled(server, f"GET {url}events?after={after}&limit=10000"))
            deadline = time.monotonic() + 20
            while metric(admin.get("/metrics").text, "yoke_open_tails") < 10:
                assert time.monotonic() < deadline, "the tails did not start"
                time.sleep(0.05)
            peak = before
            for _ in range(30):  # before: ~170 MiB more per tail within a second or two
                peak = max(peak, rss_bytes(server.process.pid))
                time.sleep(0.1)
            grown = peak - before
            assert grown < 64 << 20, f"RSS grew {grown >> 20} MiB for 10 stalled tails and 2 stalled reads"

            # Meanwhile, a reading tail and paged reads deliver everything in order.
            assert admin.post(url + "close").status_code == 200  # so that the tail ends
            got: list[tuple[str, dict]] = []
            with connect_sse(admin, "GET", url + "tail") as source:
                for sse in source.iter_sse():
                    if sse.event == "closed":
                        break
                    if sse.data:
                        got.append((sse.id, orjson.loads(sse.data)))
            assert [sse_id for sse_id, _ in got] == [str(i) for i in range(1, 1001)]
            assert [e["payload"] for _, e in got] == payloads
            read: list[str] = []
            cursor, pages = 0, 0
            while True:
                page = admin.get(url + "events", params={"after": cursor, "limit": 10_000}).json()
                if not page["events"]:
                    break
                assert len(page["events"]) < 30  # ~1 MiB each
                read += [e["payload"] for e in page["events"]]
                assert page["next_after"] == page["events"][-1]["offset"] == len(read)
                cursor, pages = page["next_after"], pages + 1
            assert read == payloads and pages > 50
    finally:
        for sock in sockets:
            sock.close()
        stop_server(server)


# --- other per-stream structures: freed when done ---------------------------------
# The runtime may also be delivering other tests' subscriptions (PostgreSQL
# shares one database): count only this test's tenant.


def waiters(y: yoke.Runtime, tenant: str) -> tuple[int, int]:
    """(waiters, streams with waiters) of ``tenant`` on the wake-up hub."""
    mine = [w for (t, _), w in y.hub._waiters.items() if t == tenant]
    return sum(len(w) for w in mine), len(mine)


def appenders(y: yoke.Runtime, tenant: str) -> int:
    return sum(1 for t, _ in y.appends._appenders if t == tenant)


async def test_appenders_are_freed_when_idle(y, tenant):
    await asyncio.gather(*(y.stream(f"/a/{i}", tenant=tenant).append({"type": "x"}) for i in range(200)))
    # A caller that goes away, and a refused call, leave nothing either.
    s = y.stream("/a/closed", tenant=tenant)
    await s.append({"type": "x"})
    await s.close()
    with pytest.raises(errors.StreamClosed):
        await s.append({"type": "y"})
    gone = asyncio.ensure_future(y.stream("/a/cancelled", tenant=tenant).append({"type": "x"}))
    await asyncio.sleep(0)  # let it queue (any point before or after would do)
    gone.cancel()
    await asyncio.wait_for(y.appends.drain(), 20)
    assert appenders(y, tenant) == 0


async def test_tails_free_their_waiters_and_shared_reads(y, tenant):
    streams = [y.stream(f"/w/{i}", tenant=tenant) for i in range(60)]
    await asyncio.gather(*(s.append({"type": "x"}) for s in streams))
    tails = [s.tail(after=0) for s in streams]
    for tail in tails:
        assert (await anext(tail)).offset == 1  # subscribed, backfilled
    assert waiters(y, tenant) == (60, 60)

    async def follow(tail):  # noqa: ANN001
        async for _ in tail:
            pass

    # A third end normally, a third is cancelled mid-wait (a client that
    # disconnects), a third both ways on one stream.
    for tail in tails[:20]:
        await tail.aclose()
    tasks = [asyncio.create_task(follow(tail)) for tail in tails[20:]]
    await asyncio.gather(*(s.append({"type": "x"}) for s in streams[20:40]))  # some mid-read
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert waiters(y, tenant) == (0, 0)
    # A read a cancelled tail had joined finishes for the others, then goes.
    reads = [future for key, (_, future) in y.shared_reads._inflight.items() if key[0] == tenant]
    await asyncio.gather(*reads, return_exceptions=True)
    assert not [key for key in y.shared_reads._inflight if key[0] == tenant]


async def test_blocked_producers_free_their_waiters(y, tenant):
    s = y.stream("/credit", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=1, overflow="block", block_timeout_s=60))
    await s.ack("r", 0)
    await s.append({"type": "e"})
    blocked = [asyncio.create_task(s.append({"type": "e"})) for _ in range(20)]
    while waiters(y, tenant)[0] < 20:  # each subscribes once it met backpressure
        await asyncio.wait(blocked, timeout=0.05)
    for task in blocked:
        task.cancel()  # the client went away
    await asyncio.gather(*blocked, return_exceptions=True)
    assert waiters(y, tenant) == (0, 0)
    # One that runs out of time frees its waiter too.
    await s.set_limits(Limits(max_unread_events=1, overflow="block", block_timeout_s=0.2))
    with pytest.raises(errors.Backpressure):
        await s.append({"type": "e"})
    assert waiters(y, tenant) == (0, 0)
    await asyncio.wait_for(y.appends.drain(), 20)
    assert appenders(y, tenant) == 0


# --- caches -----------------------------------------------------------------------


def token(i: int) -> TokenInfo:
    return TokenInfo(f"tok_{i:016x}", "t", "", ("read",), "hash", 0, None)


def test_token_cache_is_bounded():
    cache = TokenCache(max_entries=100)
    for i in range(1000):
        cache.put(f"key{i}", token(i))
        assert len(cache) <= 100
    assert cache.get("key999") == token(999) and cache.get("key0") is None
    for i in range(1000):
        cache.forget(token(i).token_id)
        assert cache.revocations <= 100
    assert len(cache) == 0 and cache.revoked(token(999).token_id)
    cache.put("key999", token(999))
    assert cache.get("key999") is None  # revoked here: not cached again


def test_token_cache_drops_expired_entries():
    cache = TokenCache(ttl_s=0.0, revoked_keep_s=0.0)
    for i in range(500):
        cache.put(f"key{i}", token(i))
        assert len(cache) <= 1  # every earlier entry has expired
    assert cache.get("key499") is None and len(cache) == 0
    cache.forget(token(1).token_id)
    cache.forget(token(2).token_id)
    assert cache.revocations <= 1 and not cache.revoked(token(1).token_id)


def test_sse_frame_cache_is_bounded_in_bytes():
    frames = FrameCache(size=4096, max_bytes=256 * KIB)
    big = prepare({"type": "x", "payload": "y" * 60_000})
    recent: deque[bytes] = deque(maxlen=3)
    for offset in range(1, 101):
        frame = frames.frame(big.to_event("t", "/big", offset, 0))
        assert frame.startswith(b"id: %d\n" % offset)
        recent.append(frame)
        assert frames.bytes <= 256 * KIB and frames.bytes == sum(len(f) for f in frames._frames.values())
    assert 1 < len(frames) <= 5


def test_sse_frames_are_written_in_chunks():
    # A page's frames go out at most CHUNK bytes at a time (the server waits
    # for a slow client between chunks), in order, split anywhere.
    from yoke.http.sse import CHUNK, FRAMES, chunks

    for sizes in ([10], [10] * 50, [60_000] * 5, [200_000], [100, 200_000, 100], [CHUNK - 40] * 3, [10_000] * 40):
        prepared = [prepare({"type": "x", "payload": "y" * n}, max_event_bytes=1 << 20) for n in sizes]
        batch = [p.to_event("t", "/chunks", i + 1, 0) for i, p in enumerate(prepared)]
        pieces = list(chunks(batch))
        assert b"".join(pieces) == b"".join(FRAMES.frame(e) for e in batch)
        assert all(len(p) == CHUNK for p in pieces[:-1]) and 0 < len(pieces[-1]) <= CHUNK


# --- actor caches keyed by stream paths and event data ------------------------------


async def test_fan_out_and_scheduler_caches_are_bounded(fresh_url, tmp_path):
    app = yoke.App()
    seen: list[tuple[str, str, int]] = []

    @app.actor("per-user", filter=yoke.Filter(types=["seen"], key="payload.user"))
    async def per_user(ctx, event):  # noqa: ANN001
        seen.append((ctx.instance.key, event.path, event.offset))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        assert y.executor is not None
        fanout, scheduler = y.executor.fanout, y.executor.scheduler
        fanout.max_cursors, scheduler.max_instances = 8, 12
        # Client-chosen stream paths and keys: 40 streams, 60 instances.
        for i in range(40):
            await y.stream(f"/visits/{i}", "acme").append_many(
                [{"type": "seen", "payload": {"user": f"u{(i * 3 + k) % 60}"}} for k in range(3)]
            )
        await y.wait_idle(timeout_s=30)
        assert len(seen) == len(set(seen)) == 120  # every event reached its instance, once
        assert len({key for key, _, _ in seen}) == 60
        assert len(fanout._cursors) <= 8
        assert len(scheduler._instances) <= 12
        # A forgotten cursor is read again from its row: nothing is routed twice.
        await y.stream("/visits/0", "acme").append({"type": "seen", "payload": {"user": "u0"}})
        await y.wait_idle(timeout_s=30)
        assert len(seen) == len(set(seen)) == 121 and len(fanout._cursors) <= 8
