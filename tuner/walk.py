"""Walking a bound space's points to its valid configurations, with progress and a deadline.

``BoundSpace.configs()`` walks every point of the domains' product once (seconds for a large
model on many devices) and keeps the result. A study walks it with ``BoundSpace.walk``, so its
progress line moves (``tick``) and ``--timeout`` holds while it runs (``deadline``); a finished walk
is kept, so ``configs()`` afterwards is free.
"""

from __future__ import annotations

from collections.abc import Callable

from autoslapo.config import ScheduleConfig
from search_spaces import BoundSpace

#: Points (and, in the ranking and the sweep, configurations) between two progress reports.
TICK = 2000

#: ``tick(done, total, unit)``: ``done`` of ``total`` ``unit`` ("points", "configurations") so far.
Tick = Callable[[int, int, str], None]


def valid_configs(bound: BoundSpace, *, deadline: float | None = None,
                  tick: Tick | None = None) -> list[ScheduleConfig] | None:
    """``bound.configs()``, walked with progress: None (nothing kept) when ``time.monotonic()``
    passes ``deadline`` first; ``tick`` every ``TICK`` points."""
    report = None if tick is None else (lambda done, total: tick(done, total, "points"))
    return bound.walk(deadline=deadline, tick=report, every=TICK)
