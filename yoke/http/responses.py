"""JSON responses and the error body every route shares."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import Request
from pydantic import BaseModel, ConfigDict
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from .. import errors
from .hints import allowed_methods, hint_sentence, missing_separator


class ErrorDetail(BaseModel):
    """``code`` is stable; other keys are details (e.g. requested, earliest, latest)."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


# Documented on every API route: the error answers it can give.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "Invalid input (invalid_input, invalid_event, invalid_cursor, invalid_path, ...)"),
        (401, "Missing or invalid bearer token (unauthorized)"),
        (403, "Missing scope, or another tenant (forbidden)"),
        (404, "Not found (stream_not_found, event_not_found, object_not_found, ...)"),
        (409, "Conflict (stream_closed, stream_exists, idempotency_conflict, ack_regression, stream_pinned, object_state,"
              " object_not_committed, legal_hold)"),
        (410, "Events after the cursor were removed by retention (cursor_gone)"),
        (413, "Too large (event_too_large, object_too_large)"),
        (422, "Uploaded bytes do not match the prepared object (object_mismatch)"),
        (429, "Unread ceiling reached (backpressure), or as many tails with an expensive where= open as the token"
              " or tenant may hold (too_many_expensive_tails); see Retry-After"),
        (503, "The database is unavailable (unavailable, see Retry-After) or the server is shutting down (runtime_closed)"),
        (507, "Total ceiling reached (quota_exhausted)"),
    ]
}


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, default=_default), status_code=status_code, media_type="application/json",
        headers=headers,
    )


def _default(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def error_response(exc: errors.YokeError) -> Response:
    headers: dict[str, str] = {}
    if "retry_after" in exc.details:
        headers["Retry-After"] = str(exc.details["retry_after"])
    if exc.http_status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return Response(error_body(exc), status_code=exc.http_status, media_type="application/json", headers=headers)


def error_body(exc: errors.YokeError) -> bytes:
    """``{"error": {code, message, details...}}``, as every route answers."""
    body = {"error": exc.to_dict()}
    try:
        return orjson.dumps(body, default=_default)
    except (TypeError, orjson.JSONEncodeError):
        # A detail that echoes the caller's input may be no JSON value of
        # ours (an integer beyond 64 bits given as a size, a lone surrogate
        # in a name): the refusal must still be the refusal, not a 500.
        return orjson.dumps(_printable(body))


def _printable(value: Any) -> Any:
    """``value`` with everything orjson refuses written as text (a lone
    surrogate as its escape)."""
    if isinstance(value, dict):
        return {_printable(str(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return str(value).encode("utf-8", "backslashreplace").decode()
    return value


async def yoke_error_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.YokeError)
    return error_response(exc)


async def validation_error_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    found = exc.errors()
    problems = [
        {"location": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg", "")}
        for e in found
    ]
    # ``field``, as every other invalid_input has: the first parameter refused
    # (its name, as a route's own checks name it; loc is ("query", name)).
    loc = found[0].get("loc", ()) if found else ()
    name = str(loc[-1]) if loc else "request"
    message = f"{name}: {found[0].get('msg', 'invalid')}" if found else "the request is invalid"
    return error_response(errors.InvalidInput(message, field=name, problems=problems))


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        return method_not_allowed(request)
    codes = {404: "not_found"}
    err = errors.YokeError(str(exc.detail))
    err.code = codes.get(exc.status_code, "http_error")
    err.http_status = exc.status_code
    return error_response(err)


def method_not_allowed(request: Request) -> Response:
    """405 ``method_not_allowed``: the methods the URL takes (also as
    ``Allow``) and, when the URL misses the ``-`` segment before a stream
    action, the route probably meant (``hint``)."""
    routes = request.app.state.routes
    method, path = request.method, request.url.path
    allowed = allowed_methods(routes, path)
    details = missing_separator(routes, method, path)
    message = f"{method} is not allowed on {path[:200]}"
    if allowed:
        message += f" (it takes {', '.join(allowed)})"
    if details:
        message += "; " + hint_sentence(details["hint"])
    err = errors.YokeError(message, allowed=allowed, **details)
    err.code = "method_not_allowed"
    err.http_status = 405
    response = error_response(err)
    response.headers["Allow"] = ", ".join(allowed)
    return response


async def internal_error_handler(_request: Request, _exc: Exception) -> Response:
    """An unexpected exception (logged by the server): 500 ``internal_error``."""
    return json_response({"error": INTERNAL_ERROR}, 500)


INTERNAL_ERROR = {"code": "internal_error", "message": "internal error"}
MAX_JSON_BODY_BYTES = 64 * 1024 * 1024
JSON_MEDIA_TYPE = "application/json"


async def json_body(request: Request) -> Any:
    """The request's JSON body, refusing to buffer more than 64 MiB."""
    return parse_json(await json_body_bytes(request))


async def json_body_bytes(request: Request) -> bytes:
    """The raw body of a JSON route (possibly empty), after the Content-Type rule."""
    check_json_content_type(request.headers)
    return await limited_body(request, MAX_JSON_BODY_BYTES)


def check_json_content_type(headers: Mapping[str, str]) -> None:
    """A JSON route's body is declared ``application/json`` (parameters such as
    ``charset`` allowed, any case) or not declared at all (taken as JSON: many
    HTTP libraries send none with a raw body). Any other declared type, e.g.
    the ``application/x-www-form-urlencoded`` of ``curl -d``, is 415
    ``unsupported_media_type``. A request without a body is not checked.
    ``headers``: Starlette's, or a dict with lower-case names."""
    declared = headers.get("content-type")
    length = headers.get("content-length")
    has_body = "transfer-encoding" in headers or (length is not None and length.strip() != "0")
    if not declared or not has_body:
        return
    media_type = declared.split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise errors.UnsupportedMediaType(
            f"the body must be {JSON_MEDIA_TYPE}, not {media_type[:80]!r}"
            " (curl: -H 'Content-Type: application/json')",
            field="Content-Type", expected=JSON_MEDIA_TYPE,
        )


async def limited_body(
    request: Request, limit: int, too_large: type[errors.EventTooLarge] = errors.EventTooLarge
) -> bytes:
    """The request body, refusing to buffer more than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"the body is at most {limit} bytes", size=int(declared), limit=limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"the body is at most {limit} bytes", limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


# orjson reads an integer beyond 64 bits as a float (silently inexact) and
# refuses a number that overflows a double. Bodies that may hold either are
# parsed by the standard library instead, which keeps integers exact and
# floats as floats, so validation refuses them by name (invalid_event).
# Only integers beyond what orjson reads exactly (above 2^64 - 1: 20 digits;
# below -2^63: a minus and 19 digits from 9...) need the slow path; an
# ordinary 19-digit timestamp in nanoseconds does not.
_LONG_DIGITS = re.compile(rb"\d{20}|-9\d{18}")
# Such an integer reads as a float of at least 9.2e18, which orjson writes
# with an exponent ("e+"): a value whose dump has no "+" is exact, found at
# C speed (a single byte is found with memchr; "e+" takes 30 times longer).
# Otherwise the body is scanned: the regex runs at about 35 MB/s, so a body
# with no run of 19 digits (every such integer has one) is ruled out first
# by a translate and find, about 25 times faster.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_DIGIT_RUN = b"0" * 19


def parse_json(body: bytes) -> Any:
    return read_json(body)[0]


def read_json(body: bytes) -> tuple[Any, bool]:
    """parse_json's value, and whether orjson read it (then it holds no NaN
    or infinity: orjson refuses a number that overflows a double)."""
    if not body:
        raise errors.InvalidInput("a JSON body is required", field="body")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    else:
        if not _may_hold_float(value) or not _may_hold_long_integer(body):
            return value, True
    try:
        return json.loads(body, parse_constant=_no_constant), False
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidInput(f"the body is not valid JSON: {exc}", field="body") from None


def _may_hold_float(value: Any) -> bool:
    """Whether orjson's value may hold a float of 1e16 or more."""
    try:
        return b"+" in orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes
        return True


def _may_hold_long_integer(body: bytes) -> bool:
    return _DIGIT_RUN in body.translate(_DIGITS_AS_ZERO) and _LONG_DIGITS.search(body) is not None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
