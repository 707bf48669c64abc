"""One logging setup for ``yoke serve`` and ``yoke worker`` (docs/production/logging.md).

Every line goes to stderr (or stdout: ``log_stream``) with a timestamp (UTC, milliseconds), a level and
the logger's name, as text or as one JSON object per line. uvicorn's loggers
(``uvicorn.error``, ``uvicorn.access``) propagate to the same handler, so the
level and the format hold for every line a process writes. A line made while
an HTTP request is handled carries its request id (``REQUEST_ID``, set by
``yoke/http/request_ids.py``), and one made under a span (tracing on) its
``trace_id`` and ``span_id``. ``yoke.open()`` in an application configures
nothing: logging is the application's then.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import orjson

from .tracing import log_ids

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
FORMATS = ("text", "json")
STREAMS = ("stderr", "stdout")

# The request being handled in this context (None outside requests).
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("yoke_request_id", default=None)

# Libraries that log every outgoing request at INFO (httpx: each webhook
# POST); their warnings and errors still show.
QUIET = ("httpx", "httpcore", "hpack", "botocore", "boto3", "urllib3", "s3transfer", "asyncio")
UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def timestamp(created: float) -> str:
    """``2025-05-01T10:00:00.123Z``: ISO 8601 in UTC, to the millisecond."""
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of its context (on the handler,
    so that records propagated from any logger get it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        if not hasattr(record, "trace_id"):
            # The current span's ids (tracing on, inside a traced request or run).
            record.trace_id, record.span_id = log_ids() or (None, None)
        return True


class TextFormatter(logging.Formatter):
    """``2025-05-01T10:00:00.123Z INFO yoke.runtime [req 4f2a...]: message``"""

    def format(self, record: logging.LogRecord) -> str:
        request = f" [req {record.request_id}]" if getattr(record, "request_id", None) else ""
        if getattr(record, "trace_id", None):
            request += f" [trace {record.trace_id} span {record.span_id}]"
        line = f"{timestamp(record.created)} {record.levelname} {record.name}{request}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id,
    exception; an access line also gets client, method, path, status."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record.created), "level": record.levelname, "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if getattr(record, "trace_id", None):
            entry["trace_id"], entry["span_id"] = record.trace_id, record.span_id
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            entry.update(client=client, method=method, path=path, http_version=version, status=status)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup(level: str = "info", fmt: str = "text", *, access_log: bool = True, stream: str = "stderr") -> None:
    """Send every log line of this process to ``stream`` (``stderr``, or
    ``stdout`` as containers collect it) at ``level`` in ``fmt`` (``text``
    or ``json``), uvicorn's included."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    if stream not in STREAMS:
        raise ValueError(f"log stream {stream!r}: one of {', '.join(STREAMS)}")
    handler = logging.StreamHandler(sys.stdout if stream == "stdout" else sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    for name in UVICORN:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)  # the root's level decides
        logger.propagate = True
    # uvicorn logs an access line only while its logger has a handler, so
    # without one it skips formatting the line at all.
    logging.getLogger("uvicorn.access").propagate = access_log
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, LEVELS[level]))
    logging.captureWarnings(True)  # warnings.warn() through the same handler
