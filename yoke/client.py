"""A small HTTP client for a Yoke server (used by the CLI).

    with Client("http://127.0.0.1:8080", token) as c:
        c.append("/orders", {"type": "order.placed"})
        for event in c.tail("/orders", after=0): ...
        c.redrive(c.instances(actor="billing")["instances"][0]["id"])
        c.subscribe("/orders", {"kind": "copy", "target": "/audit"}, name="audit")

Standard library only (``http.client`` and ``json``): every ``yoke`` command
that talks to a server imports this module, and httpx alone takes 0.15-0.5 s
to import on the development machine. One connection per request. JSON is
parsed exactly (integers of any size stay integers; ``NaN`` and infinities,
which JSON does not have, are refused both ways). Transport failures are
``OSError``s (``ConnectionRefusedError`` when nothing listens at the URL).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientError(Exception):
    """An error answer from the server: ``code``, ``status`` and the body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.code = error.get("code", "http_error")
        self.message = error.get("message", body)
        super().__init__(f"{self.code} ({status}): {self.message}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: str | bytes) -> Any:
    """JSON as Yoke reads it: exact integers, no NaN or infinities."""
    return json.loads(data, parse_constant=_no_constant)


def dumps(value: Any) -> str:
    """Compact JSON (``{"id":7}``), UTF-8 kept as is; ``ValueError`` for NaN and infinities."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def default_token(data_dir: str | None = None, port: int = 8080) -> str | None:
    """``YOKE_TOKEN``, else the admin token ``yoke serve --port <port>`` wrote
    in ``data_dir`` (default: ``YOKE_DATA_DIR`` or ``.yoke``)."""
    import os

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


def failure_url(failure_id: str, action: str = "") -> str:
    base = "/v1/failures/" + quote(failure_id, safe="")
    return f"{base}/{action}" if action else base


def correction_body(event: dict[str, Any] | None, patch: dict[str, Any] | None) -> dict[str, Any]:
    """A replay's correction fields: the ones given."""
    return {k: v for k, v in (("event", event), ("patch", patch)) if v is not None}


def instance_url(instance_id: str, action: str = "") -> str:
    base = "/v1/instances/" + quote(instance_id, safe="")
    return f"{base}/{action}" if action else base


def fork_url(fork_id: str, action: str = "") -> str:
    base = "/v1/forks/" + quote(fork_id, safe="")
    return f"{base}/{action}" if action else base


def _qids_body(qids: list[int] | None) -> dict[str, Any]:
    return {} if qids is None else {"qids": list(qids)}


def _error_body(response: http.client.HTTPResponse, data: bytes) -> dict[str, Any]:
    try:
        body = loads(data)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return body
    except ValueError:
        pass
    kind = response.getheader("Content-Type") or "no content type"
    text = data.decode("utf-8", "replace").strip()[:200]
    return {
        "error": {
            "code": "http_error",
            "message": f"not a Yoke error answer ({kind}): {text or response.reason}",
        }
    }


_UNSET: Any = object()


class Client:
    """``tenant``, when set, is sent as ``?tenant=`` with every request: the
    server refuses (403) a token of another tenant instead of answering for
    the token's own."""

    def __init__(
        self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0, tenant: str | None = None
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = url_port(url)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.tenant = tenant
        self.headers = {"Accept": "application/json", "User-Agent": "yoke-client"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.https:
            import ssl

            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _target(self, url: str, params: dict[str, Any] | None) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        if self.tenant is not None:
            query.setdefault("tenant", self.tenant)
        for key, value in query.items():
            if isinstance(value, bool):
                query[key] = "true" if value else "false"
        return self.prefix + url + (("?" + urlencode(query)) if query else "")

    def _send(
        self, method: str, url: str, params: dict[str, Any] | None, json_body: Any, timeout: float | None,
        accept: str | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = dict(self.headers)
        if accept is not None:
            headers["Accept"] = accept
        body = None
        if json_body is not _UNSET:
            body = dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connect(timeout)
        try:
            conn.request(method, self._target(url, params), body=body, headers=headers)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def request(
        self, method: str, url: str, *, params: dict[str, Any] | None = None, json: Any = _UNSET,
        timeout: float | None = None,
    ) -> Any:
        """The parsed JSON answer (``None`` for an empty one); ``ClientError``
        for an error status."""
        conn, response = self._send(method, url, params, json, self.timeout if timeout is None else timeout)
        try:
            data = response.read()
        finally:
            conn.close()
        if response.status >= 400:
            raise ClientError(response.status, _error_body(response, data))
        if response.status == 204 or not data:
            return None
        return loads(data)

    def append(self, path: str, event: dict[str, Any] | list[dict[str, Any]]) -> Any:
        return self.request("POST", stream_url(path, "events"), json=event)

    def read(self, path: str, after: int = 0, limit: int = 1000) -> Any:
        return self.request("GET", stream_url(path, "events"), params={"after": after, "limit": limit})

    def info(self, path: str) -> Any:
        return self.request("GET", stream_url(path))

    def streams(self, prefix: str = "/", limit: int | None = None, after: str | None = None) -> Any:
        return self.request("GET", "/v1/streams", params={"prefix": prefix, "limit": limit, "after": after})

    def delete_stream(self, path: str) -> Any:
        return self.request("DELETE", stream_url(path))

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

    def pause_subscription(self, path: str, name: str) -> Any:
        return self.request("POST", stream_url(path, "subscription/pause"), params={"name": name})

    def halt_subscription(self, path: str, name: str) -> Any:
        return self.request("POST", stream_url(path, "subscription/halt"), params={"name": name})

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
        params: dict[str, Any] = {"name": name, "timeout_s": timeout_s, "offset": offset}
        return self.request(
            "GET", stream_url(path, "subscription/wait"), params=params, timeout=timeout_s + 30.0
        )

    # --- actor instances and dead letters ---------------------------------

    def instances(
        self, actor: str | None = None, limit: int = 100, after: str | None = None, key: str | None = None
    ) -> Any:
        return self.request(
            "GET", "/v1/instances", params={"limit": limit, "actor": actor, "after": after, "key": key}
        )

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

    def schedules(self, instance_id: str) -> Any:
        """``{"schedules": [...]}``: the instance's timers and cron schedules."""
        return self.request("GET", instance_url(instance_id, "schedules"))

    def inputs(self, instance_id: str, after: int = 0, limit: int = 100, upto: int | None = None) -> Any:
        """``{"inputs": [...], "next_after": N or None}``: the inputs the
        instance processed, oldest first (docs/advanced/forks.md)."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if upto is not None:
            params["upto"] = upto
        return self.request("GET", instance_url(instance_id, "inputs"), params=params)

    def sql(
        self, query: str, params: list[Any] | None = None, max_rows: int | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """A read-only query across every instance's tables and Yoke's records:
        ``{columns, rows, truncated}`` (docs/advanced/sql.md)."""
        body: dict[str, Any] = {"query": query, "params": params or []}
        if max_rows is not None:
            body["max_rows"] = max_rows
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return self.request("POST", "/v1/sql", json=body)

    def sql_tables(self) -> Any:
        """What a query can name: ``{tables: [{schema, name, columns}]}``."""
        return self.request("GET", "/v1/sql/tables")

    def instance_sql(
        self, instance_id: str, sql: str, params: list[Any] | None = None, max_rows: int | None = None
    ) -> Any:
        """A read-only query on the instance's SQLite database: ``{columns, rows, truncated}``."""
        body: dict[str, Any] = {"sql": sql, "params": params or []}
        if max_rows is not None:
            body["max_rows"] = max_rows
        return self.request("POST", instance_url(instance_id, "sql"), json=body)

    # --- forks (docs/advanced/forks.md) ------------------------------------------

    def fork(self, instance_id: str, upto: int | None = None, app: str | None = None,
             edits: list[dict[str, Any]] | None = None) -> Any:
        """Fork the instance: its inputs replayed in a sandbox; the fork."""
        body = {k: v for k, v in (("upto", upto), ("app", app), ("edits", edits)) if v is not None}
        return self.request("POST", instance_url(instance_id, "forks"), json=body, timeout=600)

    def fork_failure(self, failure_id: str, event: dict[str, Any] | None = None,
                     patch: dict[str, Any] | None = None, app: str | None = None) -> Any:
        """Fork a dead letter's instance through its input, corrected: the fork."""
        body = {k: v for k, v in (("event", event), ("patch", patch), ("app", app)) if v is not None}
        return self.request("POST", "/v1/failures/" + quote(failure_id, safe="") + "/fork", json=body, timeout=600)

    def forks(self, instance_id: str | None = None, after: str | None = None, limit: int = 100) -> Any:
        return self.request("GET", "/v1/forks", params={"instance_id": instance_id, "after": after, "limit": limit})

    def fork_show(self, fork_id: str, part: str = "", params: dict[str, Any] | None = None) -> Any:
        """The fork, or ``part`` of it: runs, state, diff."""
        return self.request("GET", fork_url(fork_id, part), params=params)

    def fork_sql(self, fork_id: str, sql: str, params: list[Any] | None = None, max_rows: int | None = None) -> Any:
        body: dict[str, Any] = {"sql": sql, "params": params or []}
        if max_rows is not None:
            body["max_rows"] = max_rows
        return self.request("POST", fork_url(fork_id, "sql"), json=body)

    def discard_fork(self, fork_id: str) -> Any:
        return self.request("DELETE", fork_url(fork_id))

    def remove_instance(self, instance_id: str) -> Any:
        return self.request("DELETE", instance_url(instance_id))

    def queue(self, instance_id: str, status: str | None = None, limit: int = 100) -> Any:
        return self.request("GET", instance_url(instance_id, "queue"), params={"limit": limit, "status": status})

    def dead_letters(self, instance_id: str, limit: int = 100) -> Any:
        return self.request("GET", instance_url(instance_id, "dlq"), params={"limit": limit})

    def redrive(self, instance_id: str, qids: list[int] | None = None) -> Any:
        """Dead rows (all, or ``qids``) back to pending: ``{"redriven": n}``."""
        return self.request("POST", instance_url(instance_id, "dlq/redrive"), json=_qids_body(qids))

    def drop_dead(self, instance_id: str, qids: list[int] | None = None) -> Any:
        """Delete dead rows (all, or ``qids``): ``{"dropped": n}``."""
        return self.request("POST", instance_url(instance_id, "dlq/drop"), json=_qids_body(qids))

    # --- the failures inbox (docs/advanced/failures.md) ----------------------------

    def failures(self, limit: int = 100, **filters: Any) -> Any:
        """Open failures: ``{"failures": [...]}``, oldest first; ``filters``:
        kind, receiver, stream, actor, instance_id, subscription, since, until."""
        return self.request("GET", "/v1/failures", params={"limit": limit, **filters})

    def failure(self, failure_id: str) -> Any:
        return self.request("GET", failure_url(failure_id))

    def replay_failure(
        self, failure_id: str, event: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
        *, wait: bool = False, timeout_s: float = 30.0,
    ) -> Any:
        """Replay as it is, patched (``patch``: a JSON Merge Patch of type,
        payload and metadata) or with ``event``'s fields replacing the original's.
        ``wait``: then wait up to ``timeout_s`` (at most 60) for what becomes
        of the event: the answer's ``outcome`` (state done, failed or pending)."""
        if not wait:
            return self.request("POST", failure_url(failure_id, "replay"), json=correction_body(event, patch))
        return self.request(
            "POST", failure_url(failure_id, "replay"), params={"wait": True, "timeout_s": timeout_s},
            json=correction_body(event, patch), timeout=timeout_s + 30.0,
        )

    def discard_failure(self, failure_id: str, reason: str) -> Any:
        return self.request("POST", failure_url(failure_id, "discard"), json={"reason": reason})

    def replay_failures(
        self, filters: dict[str, Any], event: dict[str, Any] | None = None, limit: int = 1000,
        patch: dict[str, Any] | None = None,
    ) -> Any:
        body = {"filter": filters, "limit": limit, **correction_body(event, patch)}
        return self.request("POST", "/v1/failures/replay", json=body)

    def discard_failures(self, filters: dict[str, Any], reason: str, limit: int = 1000) -> Any:
        return self.request("POST", "/v1/failures/discard", json={"filter": filters, "reason": reason, "limit": limit})

    # --- tokens (the token's own tenant) -----------------------------------

    def tokens(self) -> Any:
        return self.request("GET", "/v1/tokens")

    # --- tail ----------------------------------------------------------------

    def tail(self, path: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Events as they arrive, until the stream is closed (the server's
        final ``closed`` event ends the iteration). An ``error`` event from the
        server raises ``ClientError`` (status 0); an end without ``closed`` (a
        server shutting down) is ``ClientError`` ``tail_ended`` (reconnecting
        with the last offset is the caller's choice)."""
        conn, response = self._send(
            "GET", stream_url(path, "tail"), {"after": after}, _UNSET, self.timeout, accept="text/event-stream"
        )
        try:
            if response.status >= 400:
                raise ClientError(response.status, _error_body(response, response.read()))
            if conn.sock is not None:
                conn.sock.settimeout(None)  # idle streams are fine: the server sends heartbeats
            kind, data = "", []
            for raw in response:  # Server-Sent Events: fields up to a blank line
                line = raw.decode("utf-8").rstrip("\r\n")
                if line:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "event":
                        kind = value
                    elif name == "data":
                        data.append(value)
                    continue
                if kind == "error":
                    raise ClientError(0, loads("\n".join(data)))
                if kind == "closed":
                    return
                if data:
                    yield loads("\n".join(data))
                kind, data = "", []
        finally:
            conn.close()
        raise ClientError(
            0, {"error": {"code": "tail_ended", "message": "the server ended the tail (is it shutting down?)"}}
        )
