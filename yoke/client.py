"""A small HTTP client for a Yoke server (used by the CLI).

    with Client("http://127.0.0.1:8080", token) as c:
        c.append("/orders", {"type": "order.placed"})
        for event in c.tail("/orders", after=0): ...
        c.redrive(c.instances(actor="billing")["instances"][0]["id"])
        c.subscribe("/orders", {"kind": "copy", "target": "/audit"}, name="audit")
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import orjson
from httpx_sse import connect_sse

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientError(Exception):
    """An error answer from the server: ``code``, ``status`` and the body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.code = error.get("code", "http_error")
        super().__init__(f"{self.code} ({status}): {error.get('message', body)}")


def default_token(data_dir: str | None = None, port: int = 8080) -> str | None:
    """``YOKE_TOKEN``, else the admin token ``yoke serve --port <port>`` wrote
    in ``data_dir`` (default: ``YOKE_DATA_DIR`` or ``.yoke``)."""
    from . import tokenfile

    token = os.environ.get("YOKE_TOKEN")
    if token:
        return token
    return tokenfile.read_token(tokenfile.token_file(data_dir or tokenfile.data_dir(), port))


def url_port(url: str) -> int:
    """The port ``url`` names (80 / 443 by default)."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def stream_url(path: str, action: str = "") -> str:
    """``/orders/eu`` + ``events`` → ``/v1/streams/orders/eu/-/events``."""
    if not path.startswith("/"):
        path = "/" + path
    base = "/v1/streams" + quote(path.rstrip("/"), safe="/:@~._-")
    return f"{base}/-/{action}" if action else (base if path != "/" else "/v1/streams/")


def instance_url(instance_id: str, action: str = "") -> str:
    base = "/v1/instances/" + quote(instance_id, safe="")
    return f"{base}/{action}" if action else base


def _qids_body(qids: list[int] | None) -> dict[str, Any]:
    return {} if qids is None else {"qids": list(qids)}


class Client:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.close()

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        if "json" in kwargs:
            kwargs["content"] = orjson.dumps(kwargs.pop("json"))
            kwargs.setdefault("headers", {})["Content-Type"] = "application/json"
        response = self.http.request(method, url, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"error": {"code": "http_error", "message": response.text[:500]}}
            raise ClientError(response.status_code, body)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def append(self, path: str, event: dict[str, Any] | list[dict[str, Any]]) -> Any:
        return self.request("POST", stream_url(path, "events"), json=event)

    def read(self, path: str, after: int = 0, limit: int = 1000) -> Any:
        return self.request("GET", stream_url(path, "events"), params={"after": after, "limit": limit})

    def info(self, path: str) -> Any:
        return self.request("GET", stream_url(path))

    def streams(self, prefix: str = "/") -> Any:
        return self.request("GET", "/v1/streams", params={"prefix": prefix})

    def close_stream(self, path: str) -> Any:
        return self.request("POST", stream_url(path, "close"))

    def set_retention(self, path: str, max_age_s: float | None, max_events: int | None) -> Any:
        return self.request(
            "PUT", stream_url(path, "retention"), json={"max_age_s": max_age_s, "max_events": max_events}
        )

    def set_legal_hold(self, path: str, on: bool) -> Any:
        return self.request("PUT", stream_url(path, "legal-hold"), json={"on": on})

    # --- subscriptions -----------------------------------------------------

    def subscribe(self, path: str, receiver: dict[str, Any], **config: Any) -> Any:
        """``receiver`` as JSON (``{"kind": "copy", "target": "/b"}``, ...); ``config``:
        name, filter, transform, start, on_failing_event (None: left out)."""
        body = {"receiver": receiver, **{k: v for k, v in config.items() if v is not None}}
        return self.request("POST", stream_url(path, "subscriptions"), json=body)

    def subscriptions(self, path: str) -> Any:
        return self.request("GET", stream_url(path, "subscriptions"))

    def subscription(self, path: str, name: str) -> Any:
        return self.request("GET", stream_url(path, "subscription"), params={"name": name})

    def unsubscribe(self, path: str, name: str) -> None:
        self.request("DELETE", stream_url(path, "subscription"), params={"name": name})

    def resume_subscription(self, path: str, name: str) -> Any:
        return self.request("POST", stream_url(path, "subscription/resume"), params={"name": name})

    def set_subscription_cursor(self, path: str, name: str, after_offset: int, resume: bool = False) -> Any:
        return self.request(
            "POST", stream_url(path, "subscription/cursor"), params={"name": name},
            json={"after_offset": after_offset, "resume": resume},
        )

    def wait_subscription(self, path: str, name: str, offset: int | None = None, timeout_s: float = 20.0) -> Any:
        """The status once processed through ``offset`` (default: the head);
        ``ClientError`` ``not_processed`` (504) after ``timeout_s`` (at most 60)."""
        params: dict[str, Any] = {"name": name, "timeout_s": timeout_s}
        if offset is not None:
            params["offset"] = offset
        return self.request(
            "GET", stream_url(path, "subscription/wait"), params=params, timeout=timeout_s + 30.0
        )

    # --- actor instances and dead letters ---------------------------------

    def instances(self, actor: str | None = None, limit: int = 100, after: str | None = None) -> Any:
        params: dict[str, Any] = {"limit": limit}
        if actor is not None:
            params["actor"] = actor
        if after is not None:
            params["after"] = after
        return self.request("GET", "/v1/instances", params=params)

    def create_instance(
        self,
        actor: str,
        key: str | None = None,
        config: dict[str, Any] | None = None,
        filter: dict[str, Any] | None = None,  # noqa: A002
    ) -> Any:
        body: dict[str, Any] = {"actor": actor}
        for name, value in (("key", key), ("config", config), ("filter", filter)):
            if value is not None:
                body[name] = value
        return self.request("POST", "/v1/instances", json=body)

    def instance(self, instance_id: str) -> Any:
        """The instance with its ``state`` and ``queue`` depth."""
        return self.request("GET", instance_url(instance_id))

    def queue(self, instance_id: str, status: str | None = None, limit: int = 100) -> Any:
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        return self.request("GET", instance_url(instance_id, "queue"), params=params)

    def dead_letters(self, instance_id: str, limit: int = 100) -> Any:
        return self.request("GET", instance_url(instance_id, "dlq"), params={"limit": limit})

    def redrive(self, instance_id: str, qids: list[int] | None = None) -> Any:
        """Dead rows (all, or ``qids``) back to pending: ``{"redriven": n}``."""
        return self.request("POST", instance_url(instance_id, "dlq/redrive"), json=_qids_body(qids))

    def drop_dead(self, instance_id: str, qids: list[int] | None = None) -> Any:
        """Delete dead rows (all, or ``qids``): ``{"dropped": n}``."""
        return self.request("POST", instance_url(instance_id, "dlq/drop"), json=_qids_body(qids))

    def tail(self, path: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Events as they arrive, forever (reconnecting is the caller's choice)."""
        with connect_sse(
            self.http, "GET", stream_url(path, "tail"), params={"after": after}, timeout=None
        ) as source:
            if source.response.status_code >= 400:
                source.response.read()
                try:
                    body = source.response.json()
                except ValueError:
                    body = {"error": {"code": "http_error", "message": source.response.text[:500]}}
                raise ClientError(source.response.status_code, body)
            for sse in source.iter_sse():
                if sse.event == "error":
                    data = orjson.loads(sse.data)
                    raise ClientError(0, data)
                if sse.data:
                    yield orjson.loads(sse.data)
