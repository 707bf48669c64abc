"""yoke.heap: the collector settings of yoke serve and yoke worker."""

from __future__ import annotations

import gc

from yoke import heap


def test_settle_freezes_the_startup_heap_and_collects_less_often() -> None:
    before = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0  # what was alive is out of the collector's sight
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, before[1], before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
