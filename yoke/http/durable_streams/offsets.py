"""Offset tokens, the read sentinels, cursors and the header values the
protocol parses.

A token is Yoke's integer offset, zero-padded to 16 digits, then ``_`` and
16 zeros (a position inside a message, which the server never mints; the
conformance suite forks at ``0000000000000000_0000000000000000``, the
beginning): opaque to clients, fixed-width so that string order is offset
order, and never one of the sentinels ``-1`` (the beginning) and ``now``
(the tail).
"""

from __future__ import annotations

import random
import re
from datetime import datetime

from ... import errors
from ...events import DIGITS_RE

# ASCII digits only, and few (events.DIGITS_RE).
TOKEN_RE = re.compile(r"([0-9]{16})_0{16}")
DECIMAL_RE = re.compile(r"0|[1-9][0-9]{0,18}")
MAX_SAFE = 2**53 - 1  # Producer-Epoch and Producer-Seq: JavaScript's safe integers

# Cursors (Stream-Cursor): 20-second intervals since 2024-10-09T00:00:00Z.
CURSOR_EPOCH_S = 1728432000
CURSOR_INTERVAL_S = 20


def token(offset: int) -> str:
    return f"{offset:016d}_0000000000000000"


def parse_offset(value: str | None, field: str = "offset") -> int | str | None:
    """An offset query value: None (absent), "now", or the integer offset to
    read after (``-1`` is 0)."""
    if value is None:
        return None
    if value == "-1":
        return 0
    if value == "now":
        return "now"
    match = TOKEN_RE.fullmatch(value)
    if match:
        return int(match.group(1))
    raise errors.InvalidCursor(f"invalid offset {value[:64]!r}", field=field)


def parse_token(value: str, field: str) -> int:
    match = TOKEN_RE.fullmatch(value)
    if match:
        return int(match.group(1))
    if value == "-1":
        return 0
    raise errors.InvalidInput(f"invalid {field} {value[:64]!r}", field=field)


def parse_decimal(value: str, field: str, limit: int = 2**62) -> int:
    """A non-negative decimal integer without sign, leading zero or exponent."""
    if not DECIMAL_RE.fullmatch(value) or int(value) > limit:
        raise errors.InvalidInput(f"{field} must be a non-negative integer", field=field)
    return int(value)


def parse_expires_at(value: str) -> int:
    """Stream-Expires-At (RFC 3339) in ms since the epoch."""
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise errors.InvalidInput("Stream-Expires-At must be an RFC 3339 time", field="Stream-Expires-At") from None
    if moment.tzinfo is None:
        raise errors.InvalidInput("Stream-Expires-At needs a time zone", field="Stream-Expires-At")
    return int(moment.timestamp() * 1000)


def cursor(client: str | None, now_s: float) -> str:
    """The next Stream-Cursor: the current interval at ``now_s`` (the
    runtime's wall clock), or past the client's when it already holds that
    one (so cached answers never cycle)."""
    current = int((now_s - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client is None or not DIGITS_RE.fullmatch(client) or int(client) < current:
        return str(current)
    jitter_s = random.randint(1, 3600)
    return str(int(client) + max(1, -(-jitter_s // CURSOR_INTERVAL_S)))
