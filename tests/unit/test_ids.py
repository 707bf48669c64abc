"""Event and stream ids come from a generator of their own: unique whatever
the application does with the random module, and in forked workers."""

from __future__ import annotations

import os
import random

from yoke.events import new_event_id, new_event_ids
from yoke.lifecycle import new_stream_id


def test_seeding_the_random_module_does_not_repeat_ids() -> None:
    drawn = []
    for _ in range(3):
        random.seed(1)  # as application code may
        drawn.append((new_stream_id(), new_event_id(), *new_event_ids(3)))
    streams = [d[0] for d in drawn]
    events = [e for d in drawn for e in d[1:]]
    assert len(set(streams)) == 3 and len(set(events)) == len(events)
    assert all(s.startswith("str_") and len(s) == 28 for s in streams)


def test_a_forked_process_draws_ids_of_its_own() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as a `yoke serve --workers` process
        try:
            os.write(write, (new_stream_id() + new_event_id()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 200).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    mine = new_stream_id() + new_event_id()
    assert len(child) == len(mine) == 28 + 32
    assert child[:28] != mine[:28]  # stream ids
    assert child[28 + 12 :] != mine[28 + 12 :]  # event ids' random part
