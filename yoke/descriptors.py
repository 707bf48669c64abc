"""The file-descriptor limit of Yoke's own long-running processes (``yoke
serve``, ``yoke worker``): raised at start from the soft limit to the hard
one, as Go's runtime does for its programs, so that a worker can keep
thousands of instance databases open (three descriptors each,
actors/state.py) where the usual soft limit of 1,024 allowed a few hundred.
An application that embeds Yoke keeps the limits it set.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("yoke.descriptors")


def raise_soft_limit() -> int:
    """The soft limit raised to the hard one where it is lower; returns the
    soft limit in force (``resource.RLIM_INFINITY`` when unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or soft == resource.RLIM_INFINITY:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # an unlimited hard limit some kernels refuse as a soft one
        log.debug("the descriptor limit stays at %s: %s", soft, exc)
        return soft
    return hard
