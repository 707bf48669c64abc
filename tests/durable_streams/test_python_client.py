"""The protocol's Python client (PyPI ``durable-streams``, sync and async)
driving Yoke streams over ``yoke serve --dev``, on both backends: create,
append, catch-up read, live read, resume from a returned offset; and the
same messages seen as events through Yoke's own API."""

from __future__ import annotations

import asyncio
import threading
import uuid

import httpx
from durable_streams import AsyncDurableStream, DurableStream


def url(server, name: str) -> str:
    return f"{server.url}/v1/stream/{name}"


def yoke_events(server, name: str) -> list[dict]:
    """The stream's events through Yoke's own API (the admin token)."""
    with server.client() as client:
        answer = client.get(f"/v1/streams/{name}/-/events", params={"after": 0})
    answer.raise_for_status()
    return answer.json()["events"]


def test_sync_client_json(dev_server) -> None:
    name = "py-sync-" + uuid.uuid4().hex[:8]
    with DurableStream.create(url(dev_server, name), content_type="application/json", batching=False) as handle:
        first = handle.append({"n": 1})
        handle.append({"n": 2})
        handle.append({"n": 3})
        with handle.stream(offset="-1", live=False) as res:
            assert list(res.iter_json()) == [{"n": 1}, {"n": 2}, {"n": 3}]
            tail = res.offset
        assert tail > first.next_offset  # offsets compare as strings

        # Resume from a returned offset: only what came after it.
        with handle.stream(offset=first.next_offset, live=False) as res:
            assert list(res.iter_json()) == [{"n": 2}, {"n": 3}]

        # Live: a long-poll read gets a message appended while it waits.
        appended = threading.Event()

        def append_later() -> None:
            handle.append({"n": 4})
            appended.set()

        with handle.stream(offset=tail, live="long-poll") as res:
            writer = threading.Thread(target=append_later)
            writer.start()
            items = res.iter_json()
            assert next(items) == {"n": 4}
            writer.join(timeout=30)
        assert appended.is_set()

    events = yoke_events(dev_server, name)
    assert [(e["type"], e["payload"]) for e in events] == [("ds.message", {"n": i}) for i in range(1, 5)]


def test_sync_client_bytes_and_sse(dev_server) -> None:
    name = "py-bytes-" + uuid.uuid4().hex[:8]
    payload = bytes(range(256))
    with DurableStream.create(url(dev_server, name), content_type="application/octet-stream",
                              batching=False) as handle:
        handle.append(payload)
        handle.append(b"\x00tail")
        with handle.stream(offset="-1", live=False) as res:
            assert res.read_bytes() == payload + b"\x00tail"
    # Stored as bytes: Yoke's JSON shows them base64-encoded.
    events = yoke_events(dev_server, name)
    assert [e["type"] for e in events] == ["ds.bytes", "ds.bytes"]
    assert events[1]["data_base64"] == "AHRhaWw="

    # A text stream live over SSE (this client reads SSE as text or JSON).
    name = "py-text-" + uuid.uuid4().hex[:8]
    with DurableStream.create(url(dev_server, name), content_type="text/plain", batching=False) as handle:
        handle.append("line one\n")
        with handle.stream(offset="-1", live="sse") as res:
            received = ""
            texts = res.iter_text()
            received += next(texts)
            handle.append("line two\nend")
            while not received.endswith("end"):
                received += next(texts)
        assert received == "line one\nline two\nend"


async def test_async_client(dev_server) -> None:
    name = "py-async-" + uuid.uuid4().hex[:8]
    handle = await AsyncDurableStream.create(url(dev_server, name), content_type="application/json")
    try:
        results = await asyncio.gather(*(handle.append({"i": i}) for i in range(20)))  # batched by the client
        tail = max(r.next_offset for r in results)
        async with handle.stream(offset="-1", live=False) as res:
            items = [item async for item in res.iter_json()]
        assert sorted(item["i"] for item in items) == list(range(20))

        # Live over SSE, resumed from the offset the catch-up returned.
        async def append_later() -> None:
            await handle.append({"i": "live"})

        async with handle.stream(offset=tail, live="sse") as res:
            writer = asyncio.create_task(append_later())
            async with asyncio.timeout(30):
                async for item in res.iter_json():
                    assert item == {"i": "live"}
                    break
            await writer

        head = await handle.head()
        assert head.offset > tail
    finally:
        await handle.aclose()
    assert len(yoke_events(dev_server, name)) == 21


def test_events_appended_through_yoke_read_through_the_protocol(dev_server) -> None:
    name = "py-native-" + uuid.uuid4().hex[:8]
    with dev_server.client() as client:
        client.post(f"/v1/streams/{name}/-/events", json={"type": "order.placed", "payload": {"id": 7}}).raise_for_status()
    with DurableStream.connect(url(dev_server, name)) as handle:
        with handle.stream(offset="-1", live=False) as res:
            assert list(res.iter_json()) == [{"type": "order.placed", "payload": {"id": 7}}]
    # A token is still checked on a --dev server: a wrong one is refused.
    answer = httpx.get(url(dev_server, name), headers={"Authorization": "Bearer yk_tok_wrong"})
    assert answer.status_code == 401
