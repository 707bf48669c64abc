"""The webhook receiver: one signed POST per event (Standard Webhooks).

Body ``{"attempt", "event", "path", "name", "stream_id",
"stream_created_at", "generation"}`` (the last three: the run that sent it,
to fence a superseded one); headers ``webhook-id`` (``<stream_id>:<offset>``,
the receiver's deduplication key), ``webhook-timestamp`` (unix seconds),
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``
keyed with the ``whsec_`` secret) and the run again, as ``yoke-stream-id``,
``yoke-stream-created-at`` and ``yoke-generation``. A 2xx status within the
timeout acknowledges the event; a 429 or 503 with ``Retry-After`` sets the
next attempt's delay; anything else is a failure. The status decides: the
answer's body is then read only so that its kept-alive connection can carry
the next POST (httpx closes a connection whose answer was not read to its
end), and only a small one (``DRAIN_BYTES``) that arrives at once
(``DRAIN_S``); a larger or slower body is abandoned with its connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

import httpx
import orjson

from .. import errors
from ..clock import SYSTEM, Clock
from ..tracing import inject_current
from .receivers import signing_key

if TYPE_CHECKING:
    from .batch import Batch

MAX_RETRY_AFTER_S = 1800.0
# An answer's body read to its end so its connection is reused: at most
# this many bytes, arriving within this many seconds after the status.
DRAIN_BYTES = 64 * 1024
DRAIN_S = 0.5
# How much of a failing receiver's answer its error quotes.
EXCERPT_BYTES = 1024
EXCERPT_CHARS = 300


class WebhookFailed(errors.YokeError):
    """The webhook receiver did not acknowledge the event."""

    code = "webhook_failed"
    http_status = 502

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    secret: str, headers: dict[str, str], body: bytes, tolerance_s: int = 300, *, clock: Clock = SYSTEM
) -> None:
    """What a receiver does (also used by Yoke's tests): raise ``ValueError``
    unless one of the ``webhook-signature`` entries matches and the timestamp
    is within ``tolerance_s`` of now."""
    msg_id, stamp = headers["webhook-id"], int(headers["webhook-timestamp"])
    if abs(clock.wall() - stamp) > tolerance_s:
        raise ValueError("webhook timestamp outside the tolerance")
    expected = sign(secret, msg_id, stamp, body).encode()
    for candidate in headers["webhook-signature"].split():
        if hmac.compare_digest(candidate.encode(), expected):
            return
    raise ValueError("no matching webhook signature")


def retry_after_s(value: str | None, clock: Clock = SYSTEM) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - clock.wall()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


async def send(
    batch: Batch, client: httpx.AsyncClient, url: str, secret: str | None, timeout_s: float, *,
    clock: Clock = SYSTEM,
) -> None:
    if not secret:
        raise WebhookFailed("the webhook secret is missing (configure the subscription again)")
    for event in batch.events:  # one event per POST (the batch holds one)
        body = orjson.dumps({
            "attempt": batch.attempt, "event": event.to_dict(), "path": batch.path, "name": batch.name,
            **batch.lifetime(),
        })
        msg_id = f"{batch.stream_id}:{event.offset}"
        stamp = int(clock.wall())
        headers = {
            "content-type": "application/json",
            # An answer as it is sent: drain() counts its bytes and quotes
            # its start, neither of which a compressed body allows.
            "accept-encoding": "identity",
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(secret, msg_id, stamp, body),
            "yoke-stream-id": batch.stream_id,
            "yoke-stream-created-at": str(batch.created_at),
            "yoke-generation": str(batch.generation),
        }
        inject_current(headers)  # traceparent: the receiver joins the delivery's trace
        request = client.build_request("POST", url, content=body, headers=headers)
        loop = asyncio.get_running_loop()
        started = loop.time()  # the exchange's real duration (evidence in the error), not the clock's
        try:
            # A deadline for the whole exchange up to the status line.
            async with asyncio.timeout(timeout_s):
                response = await client.send(request, stream=True)
        except TimeoutError:
            raise WebhookFailed(f"POST {url} got no answer within {timeout_s}s") from None
        except httpx.HTTPError as exc:
            raise WebhookFailed(f"POST {url} failed: {type(exc).__name__}: {exc}") from None
        try:
            status = response.status_code
            retry_after = response.headers.get("retry-after")
            took_ms = round((loop.time() - started) * 1000)
            head = await drain(response)
        finally:
            await response.aclose()
        if 200 <= status < 300:
            continue
        wait = retry_after_s(retry_after, clock) if status in (429, 503) else None
        said = excerpt(head)
        raise WebhookFailed(f"POST {url} answered {status} in {took_ms} ms" + (f": {said}" if said else ""),
                            retry_after_s=wait)


def excerpt(head: bytes) -> str:
    """The start of a receiver's answer, as evidence in an error: printable
    text on one line (NUL and other controls replaced: the error is stored
    and appended as an event), at most ``EXCERPT_CHARS``."""
    text = "".join(c if c.isprintable() or c.isspace() else "\ufffd" for c in head.decode("utf-8", errors="replace"))
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


async def drain(response: httpx.Response) -> bytes:
    """Read a small answer body to its end (``DRAIN_BYTES`` within
    ``DRAIN_S``), so that the connection returns to the pool; give up on
    anything larger or slower, or on an error (the connection then closes).
    The status has decided already: nothing here fails a delivery. Returns
    the body's first ``EXCERPT_BYTES`` (what arrived of them)."""
    read = 0
    head = bytearray()
    try:
        async with asyncio.timeout(DRAIN_S):
            async for chunk in response.aiter_raw():  # as sent: the request asks for no encoding
                read += len(chunk)
                if len(head) < EXCERPT_BYTES:
                    head += chunk[: EXCERPT_BYTES - len(head)]
                if read > DRAIN_BYTES:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass
    return bytes(head)
