"""Appends to a stream the protocol route remembers (http/durable_streams/
remembered.py), after the stream was changed where the route does not see it:
through Yoke's own API (as another process would). Each append is answered
from the stream as it is now. Both backends."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx
import pytest

from tests.http.conftest import Server

JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}


def _remembered(server: Server, *bodies: bytes) -> tuple[str, str]:
    """A new JSON stream's name and URL, after appends the route remembers it by."""
    name = "known-" + uuid.uuid4().hex[:8]
    url = f"{server.url}/v1/stream/{name}"
    assert httpx.put(url, headers=JSON).status_code == 201
    for body in bodies:
        assert httpx.post(url, headers=JSON, content=body).status_code == 204
    return name, url


def test_an_append_after_a_delete_elsewhere_is_not_found_and_creates_nothing(dev_server: Server) -> None:
    name, url = _remembered(dev_server, b'{"n":1}')
    with dev_server.client() as client:
        assert client.delete(f"/v1/streams/{name}").status_code == 200
        assert httpx.post(url, headers=JSON, content=b'{"n":2}').status_code == 404
        assert client.get(f"/v1/streams/{name}").status_code == 404


def test_an_append_goes_to_the_stream_created_again_with_its_content_type(dev_server: Server) -> None:
    name, url = _remembered(dev_server, b'{"n":1}')
    with dev_server.client() as client:
        assert client.delete(f"/v1/streams/{name}").status_code == 200
    assert httpx.put(url, headers=TEXT).status_code == 201
    # The remembered stream took JSON; the one at the path now does not.
    assert httpx.post(url, headers=JSON, content=b'{"n":2}').status_code == 409
    assert httpx.post(url, headers=TEXT, content=b"hello").status_code == 204
    assert httpx.get(url, params={"offset": "-1"}).text == "hello"


def test_an_append_goes_to_the_stream_created_again_not_the_old_one(dev_server: Server) -> None:
    name, url = _remembered(dev_server, *(b'{"old":%d}' % n for n in range(3)))
    with dev_server.client() as client:
        assert client.delete(f"/v1/streams/{name}").status_code == 200
    created = httpx.put(url, headers=JSON)
    assert created.status_code == 201
    answer = httpx.post(url, headers=JSON, content=b'{"new":1}')
    assert answer.status_code == 204
    assert answer.headers["stream-next-offset"] > created.headers["stream-next-offset"]
    assert httpx.get(url, params={"offset": "-1"}).json() == [{"new": 1}]


def test_an_append_after_a_close_elsewhere_is_refused_with_the_current_offset(dev_server: Server) -> None:
    name, url = _remembered(dev_server, b'[{"n":1},{"n":2}]')
    with dev_server.client() as client:
        assert client.post(f"/v1/streams/{name}/-/events", json={"type": "other"}).status_code == 201
        assert client.post(f"/v1/streams/{name}/-/close").status_code == 200
    refused = httpx.post(url, headers=JSON, content=b'{"n":3}')
    assert refused.status_code == 409
    assert refused.headers["stream-closed"] == "true"
    assert refused.headers["stream-next-offset"] == httpx.head(url).headers["stream-next-offset"]
    assert len(httpx.get(url, params={"offset": "-1"}).json()) == 3


def test_a_post_racing_a_delete_gets_404_and_creates_nothing(dev_server: Server) -> None:
    """PostgreSQL: a DELETE commits between the POST's decision (for the
    stream it remembers) and its append. The append must not create the
    path again."""
    if not dev_server.db_url.startswith("postgresql"):
        pytest.skip("SQLite's single writer takes the DELETE and the append one after the other")
    name, url = _remembered(dev_server, b'{"n":1}')

    async def race() -> httpx.Response:
        conn = await asyncpg.connect(dev_server.db_url)  # the admin role: no row-level security
        try:
            tx = conn.transaction()
            await tx.start()
            # A delete in progress: the stream row locked and removed, not yet committed.
            sid = await conn.fetchval(
                "SELECT sid FROM streams WHERE tenant_id='default' AND path=$1 FOR UPDATE", "/" + name
            )
            for table in ("events", "protocol_streams", "streams"):
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id='default' AND sid=$1", sid)
            post = asyncio.ensure_future(asyncio.to_thread(httpx.post, url, headers=JSON, content=b'{"n":2}'))
            # The POST has decided for the stream (still there for it) once
            # its append waits for the row lock.
            deadline = time.monotonic() + 10
            while not await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                assert not post.done() and time.monotonic() < deadline, "the append never waited for the lock"
                await asyncio.sleep(0.01)
            await tx.commit()
            answer = await post
            assert await conn.fetchval("SELECT count(*) FROM streams WHERE path=$1", "/" + name) == 0
            return answer
        finally:
            await conn.close()

    assert asyncio.run(race()).status_code == 404
    assert httpx.get(url, params={"offset": "-1"}).status_code == 404


async def test_appends_to_a_remembered_stream_do_not_look_it_up(db_url: str) -> None:
    """The route looks a stream up for its first append only, on both
    backends (PostgreSQL's looked it up for every request): what other
    processes change is caught by the append itself, as the tests above
    show. Counted at the store, the route served in process."""
    import contextlib

    import yoke
    from yoke.http.app import asgi_app, create_app, serve_runtime

    async with yoke.open(db_url, executor=False) as runtime:
        protocol = runtime.store.protocol
        looked_up: list[str] = []
        stream_of = protocol.stream

        async def counted(tenant: str, path: str):  # noqa: ANN202 - the store's answer
            looked_up.append(path)
            return await stream_of(tenant, path)

        protocol.stream = counted  # type: ignore[method-assign]
        app = create_app(contextlib.nullcontext)
        serve_runtime(app, runtime)
        app.state.dev = True
        transport = httpx.ASGITransport(app=asgi_app(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://yoke") as client:
            name = "known-" + uuid.uuid4().hex[:8]
            assert (await client.put(f"/v1/stream/{name}", headers=JSON)).status_code == 201
            looked_up.clear()
            for n in range(5):
                answer = await client.post(f"/v1/stream/{name}", headers=JSON, content=b'{"n":%d}' % n)
                assert answer.status_code == 204
            assert looked_up == [f"/{name}"]  # the first append's lookup, then none
            assert [m["n"] for m in (await client.get(f"/v1/stream/{name}", params={"offset": "-1"})).json()] == [0, 1, 2, 3, 4]
