"""The garbage collector's settings in Yoke's own long-running processes
(``yoke serve``, ``yoke worker``); an application that embeds Yoke keeps its
own.

A batch append allocates thousands of small objects (parsed messages, their
texts, rows), so with CPython's default young-generation threshold (700) the
collector ran every few requests and walked every object the process holds:
an eighth of the event loop's time in batch appends. After startup the
objects alive (modules, the app, the runtime) are frozen out of the
collector's sight, and the young generation is collected every 20,000
allocations.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle() -> None:
    """Call once the process has started: freeze what is alive, collect less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
