"""Walking a bound space's points to its valid configurations, and predicting them, with progress
and a deadline.

``BoundSpace.configs()`` walks every point of the domains' product once (seconds for a large
model on many devices) and keeps the result. A study walks it with ``BoundSpace.walk``, so its
progress line moves (``tick``) and ``--timeout`` holds while it runs (``deadline``); a finished walk
is kept, so ``configs()`` afterwards is free. The prior's ranking and the sim sweep then predict
each configuration, checking ``paced`` after each (the same check the walk makes).
"""

from __future__ import annotations

from collections.abc import Callable

from autoslapo.config import ScheduleConfig
from search_spaces import BoundSpace, on_pace

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


def paced(done: int, total: int, unit: str, *, deadline: float | None, tick: Tick | None) -> bool:
    """After the ``done``-th of ``total`` ``unit``: every ``TICK``, False when ``time.monotonic()``
    has passed ``deadline`` (stop), else ``tick(done, total, unit)``; True otherwise."""
    if done % TICK:
        return True  # the common case, without building the report
    report = None if tick is None else (lambda d, t: tick(d, t, unit))
    return on_pace(done, total, deadline=deadline, tick=report, every=TICK)
