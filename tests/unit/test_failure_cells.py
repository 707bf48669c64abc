"""`yoke failures list`'s ERROR column: one line, cut at a word and marked,
never mid-word (`yoke failures show ID` prints the whole error)."""

from __future__ import annotations

from yoke.cli.failures import ERROR_CELL_CHARS, error_cell


def test_a_long_error_is_cut_at_a_word_and_marked() -> None:
    error = "WebhookFailed: POST http://h/hook answered 500 in 2 ms: " + "ledger unavailable " * 20
    cell = error_cell(error)
    assert len(cell) <= ERROR_CELL_CHARS and cell.endswith(" …")
    assert error.startswith(cell.removesuffix(" …"))
    assert cell.removesuffix(" …").endswith("unavailable") or cell.removesuffix(" …").endswith("ledger")


def test_short_and_missing_errors() -> None:
    assert error_cell("ValueError: poisoned order 1") == "ValueError: poisoned order 1"
    assert error_cell("ValueError: x\n  at line 2") == "ValueError: x at line 2"  # one line
    assert error_cell(None) == "-" and error_cell("") == "-"


def test_a_word_longer_than_the_cell_is_cut_inside() -> None:
    error = "ValueError: " + '{"very":"long","json":"blob"}' * 10
    cell = error_cell(error)
    assert cell.endswith(" …") and len(cell) == ERROR_CELL_CHARS and error.startswith(cell.removesuffix(" …"))
