"""``streams/rules.py``: who may do what to a stream, one table.

Each row: the stream's pins, the caller, the action, and the answer (an
error code, or what the admission must still honour). The same function
answers every surface (tests/http/test_stream_rules.py checks that each
surface asks it)."""

from __future__ import annotations

import pytest

from yoke import errors
from yoke.events import prepare
from yoke.streams.data_handling import DataHandling
from yoke.streams.rules import (
    APPEND, APPLICATION, CONFIGURE, DELETE, READ, Caller, admit, may_pin,
)

PATH = "/runs/r1/answer"

PINS = {
    "none": None,
    "authorization": DataHandling.from_body(
        {"authorization": {"read": {"scopes": ["run:read"]}, "append": {"scopes": ["run:write"]}}}
    ),
    "redaction": DataHandling.from_body({"redaction": [{"path": "$.payload.secret", "lifted_by": ["pii:read"]}]}),
    "egress": DataHandling.from_body({"placement": {"client_egress_regions": ["eu-west-1"]}}),
    "classes": DataHandling.from_body({"content_classes": ["model_output"]}),
    "input": DataHandling.from_body({"direction": "input"}),
}

GENERIC = Caller.generic(("admin", "read", "append"), "tok_0000000000000000")
PLAIN_READER = Caller.workflow(("read",), "tok_0000000000000001", None)
RUN_READER = Caller.workflow(("read", "run:read", "pii:read"), "tok_0000000000000002", None)
WRITER = Caller.workflow(("append", "run:write"), "tok_0000000000000003", None)
FAR_AWAY = Caller.workflow(("read", "run:read"), "tok_0000000000000004", "us-east-1")
NEARBY = Caller.workflow(("read",), "tok_0000000000000005", "eu-west-1")

ALL_ACTIONS = (READ, APPEND, CONFIGURE, DELETE)

# (pins, caller, actions, answer): an error code, "ok", or "masked" (a read
# that hides payload.secret).
TABLE = [
    # Nothing pinned: every caller, every action.
    ("none", GENERIC, ALL_ACTIONS, "ok"),
    ("none", PLAIN_READER, ALL_ACTIONS, "ok"),
    ("none", APPLICATION, ALL_ACTIONS, "ok"),
    # A surface that cannot carry pins is refused whatever the pin.
    *[(pins, GENERIC, ALL_ACTIONS, "data_handling_pinned") for pins in PINS if pins != "none"],
    # The application itself: who-is-asking rules do not apply.
    *[(pins, APPLICATION, ALL_ACTIONS, "ok") for pins in PINS if pins != "none"],
    # Authorization, on the workflow surface.
    ("authorization", PLAIN_READER, (READ, APPEND), "forbidden"),
    ("authorization", RUN_READER, (READ,), "ok"),
    ("authorization", RUN_READER, (APPEND,), "forbidden"),
    ("authorization", WRITER, (APPEND,), "ok"),
    ("authorization", PLAIN_READER, (CONFIGURE, DELETE), "ok"),  # admin routes: the token's scope decides
    # Redaction: reads masked unless lifted.
    ("redaction", PLAIN_READER, (READ,), "masked"),
    ("redaction", RUN_READER, (READ,), "ok"),
    ("redaction", PLAIN_READER, (APPEND,), "ok"),
    # Egress: a declared region outside the set, every action.
    ("egress", FAR_AWAY, ALL_ACTIONS, "egress_refused"),
    ("egress", NEARBY, ALL_ACTIONS, "ok"),
    ("egress", PLAIN_READER, ALL_ACTIONS, "ok"),  # no region declared
]


def _answer(pins: str, caller: Caller, action: str) -> str:
    try:
        admission = admit(PATH, PINS[pins], caller, action)
    except errors.YokeError as exc:
        return exc.code
    return "masked" if admission.redactor is not None else "ok"


@pytest.mark.parametrize(("pins", "caller", "actions", "expected"), TABLE)
def test_admit(pins, caller, actions, expected):
    assert {action: _answer(pins, caller, action) for action in actions} == {a: expected for a in actions}


def test_a_masked_read_hides_the_value_and_keeps_the_stored_event():
    admission = admit(PATH, PINS["redaction"], PLAIN_READER, READ)
    event = prepare({"type": "x", "payload": {"secret": "s3", "kept": 1}}).to_event("t", PATH, 1, 0)
    (masked,) = admission.mask([event])
    assert masked.payload == {"secret": "[redacted]", "kept": 1}
    assert event.payload == {"secret": "s3", "kept": 1}
    assert admission.view == ("$.payload.secret",)
    assert admit(PATH, PINS["redaction"], RUN_READER, READ).view == ()


@pytest.mark.parametrize("caller", [APPLICATION, WRITER])
def test_content_classes_bind_every_caller_that_may_append(caller):
    admission = admit(PATH, PINS["classes"], caller, APPEND)
    with pytest.raises(errors.ContentClassRefused):
        admission.check_records([{"type": "x"}])
    with pytest.raises(errors.ContentClassRefused):
        admission.check_records([{"type": "x", "metadata": {"content_class": "user_input"}}])
    admission.check_records([{"type": "x", "metadata": {"content_class": "model_output"}}])
    kernel = [prepare({"type": "x", "metadata": {"content_class": "user_input"}})]
    with pytest.raises(errors.ContentClassRefused):
        admission.check_prepared(kernel, "a copy")


def test_raw_hidden_reasoning_is_refused_on_every_workflow_stream_only():
    hidden = [{"type": "x", "metadata": {"content_class": "Raw-Hidden Model.Reasoning"}}]
    with pytest.raises(errors.ContentClassRefused):
        admit(PATH, None, APPLICATION, APPEND).check_records(hidden)
    admit("/orders", None, APPLICATION, APPEND).check_records(hidden)  # not a workflow stream


def test_input_streams_name_their_run_and_refuse_kernel_appends():
    admission = admit(PATH, PINS["input"], APPLICATION, APPEND)
    assert admission.input_wake == "/runs/r1"
    assert admit(PATH, PINS["classes"], APPLICATION, APPEND).input_wake is None
    with pytest.raises(errors.DataHandlingPinned):
        admission.check_prepared([prepare({"type": "x"})], "a copy")


def test_only_workflow_streams_may_pin():
    assert may_pin("/runs/r1/answer") and not may_pin("/orders") and not may_pin("/runsx/a")
