"""What a failing webhook receiver answered, quoted in the error: one line,
bounded, and never a character the stores or events refuse (NUL)."""

from __future__ import annotations

from yoke.subscriptions.webhooks import EXCERPT_CHARS, excerpt


def test_one_line_bounded() -> None:
    assert excerpt(b'{"error":\n  "ledger is down"}') == '{"error": "ledger is down"}'
    long = excerpt(b"x" * 5000)
    assert len(long) == EXCERPT_CHARS + 1 and long.endswith("…")
    assert excerpt(b"") == ""


def test_controls_and_bad_bytes_are_replaced() -> None:
    said = excerpt(b"bad\x00answer\x07 \xff end")
    assert "\x00" not in said and "\x07" not in said
    assert said == "bad\ufffdanswer\ufffd \ufffd end"
