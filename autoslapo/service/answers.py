"""Hot answers kept in memory: ``GET /v1/best`` and the studies list, refreshed in the background.

Fifty clients asking for the same best schedule should not run fifty database queries (and hold
the GIL for each) when the answer changes at most once a trial. ``AnswerCache`` keeps one answer
per key for ``fresh_s``. A request that finds its answer older than that still gets it at once and
starts one refresh in a worker thread (never more than one per key); a request that finds it older
than ``stale_s``, or none at all, waits for a fresh one. So a new better trial shows in the answer
within ``fresh_s`` plus one refresh of the first request after it, and never later than ``stale_s``.
Errors are not kept: the next request asks the store again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from autoslapo.errors import UsageError

FRESH_S = 1.0
STALE_S = 10.0
MAX_KEYS = 1024


@dataclass
class _Entry:
    value: Any
    at: float
    refreshing: asyncio.Task[Any] | None = None


class AnswerCache:
    """Answers by key: fresh for ``fresh_s`` seconds, served while a refresh runs up to ``stale_s``.

    ``fresh_s`` 0 turns the cache off (every request asks the store). At most ``max_keys`` answers
    are kept, the least recently used dropped first. ``clock`` is monotonic seconds.
    """

    def __init__(self, fresh_s: float = FRESH_S, stale_s: float = STALE_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if fresh_s < 0 or stale_s < fresh_s or max_keys < 1:
            raise UsageError(f"the answer cache needs 0 <= fresh_s <= stale_s and max_keys >= 1: got fresh_s="
                             f"{fresh_s}, stale_s={stale_s}, max_keys={max_keys}")
        self.fresh_s = fresh_s
        self.stale_s = stale_s
        self.max_keys = max_keys
        self.clock = clock
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._pending: dict[Hashable, asyncio.Task[Any]] = {}

    async def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The answer for ``key``; ``compute`` (blocking, run in a worker thread) makes a new one.

        Raises whatever ``compute`` raises when the caller has to wait for it.
        """
        if self.fresh_s == 0:
            return await run_in_threadpool(compute)
        entry = self._entries.get(key)
        now = self.clock()
        if entry is not None:
            self._entries.move_to_end(key)
            age = now - entry.at
            if age < self.fresh_s:
                return entry.value
            if age < self.stale_s:
                if key not in self._pending:
                    self._start(key, compute).add_done_callback(_quiet)
                return entry.value
        return await asyncio.shield(self._pending.get(key) or self._start(key, compute))

    def expire(self) -> None:
        """Make every answer due for a refresh (still served meanwhile, as any stale answer): after a
        write this server made, so the next request starts a refresh that sees it."""
        due = self.clock() - self.fresh_s
        for entry in self._entries.values():
            entry.at = min(entry.at, due)

    def _start(self, key: Hashable, compute: Callable[[], Any]) -> asyncio.Task[Any]:
        async def refresh() -> Any:
            started = self.clock()
            try:
                value = await run_in_threadpool(compute)
            finally:
                self._pending.pop(key, None)
            self._entries[key] = _Entry(value, started)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)
            return value

        task = asyncio.get_running_loop().create_task(refresh())
        self._pending[key] = task
        return task


def _quiet(task: asyncio.Task[Any]) -> None:
    # A background refresh that failed is retried by the next request; read its error so asyncio
    # does not report it as never retrieved.
    if not task.cancelled():
        task.exception()
