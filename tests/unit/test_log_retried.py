"""Background passes that run again log a database fault as one warning
line, and anything else (a bug) with its traceback."""

from __future__ import annotations

import logging

from yoke import errors
from yoke.store.faults import log_retried, unavailable


def test_a_database_fault_is_a_warning_line_and_a_bug_a_traceback(caplog) -> None:
    log = logging.getLogger("yoke.test.pass")
    caplog.set_level(logging.INFO, logger="yoke.test.pass")
    try:
        try:
            raise ValueError("the driver's own error")
        except ValueError as cause:
            raise unavailable("the database connection was lost; retry later", "connection_lost") from cause
    except errors.Unavailable:
        log_retried(log, "pass of %s failed", "t1")
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        log_retried(log, "pass of %s failed", "t2")
    fault, bug = caplog.records
    assert (fault.levelno, fault.getMessage(), fault.exc_info) == (
        logging.WARNING, "pass of t1 failed: the database connection was lost; retry later", None)
    assert "the driver's own error" not in caplog.text.split("pass of t2")[0]
    assert bug.levelno == logging.ERROR and bug.getMessage() == "pass of t2 failed"
    assert bug.exc_info is not None and bug.exc_info[0] is RuntimeError
