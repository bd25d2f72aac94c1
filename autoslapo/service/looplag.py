"""How late the server's event loop runs: a probe task, its histogram in ``/metrics``.

Every request's bytes are read, parsed and answered on the one event-loop thread. When that thread
waits (for the GIL held by a thread-pool job, for a core the machine gives to other processes, or
behind a long callback), every request in flight waits with it, and the request-latency histogram
(which starts when the app is called) does not see it. The probe sleeps ``interval_s`` again and
again and records how much later than asked it woke: a load test reads the server's own share of
the latency its clients measure from ``autoslapo_event_loop_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from prometheus_client import CollectorRegistry, Histogram

from autoslapo.errors import UsageError

INTERVAL_S = 0.01
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def loop_lag_histogram(registry: CollectorRegistry) -> Histogram:
    """The ``autoslapo_event_loop_lag_seconds`` histogram, registered in ``registry``."""
    return Histogram("autoslapo_event_loop_lag_seconds", "how late the event loop woke from a probe's sleep",
                     registry=registry, buckets=BUCKETS)


async def watch_loop(histogram: Histogram, interval_s: float = INTERVAL_S) -> None:
    """Sleep ``interval_s`` forever, observing each wake-up's lateness in ``histogram`` (until cancelled)."""
    if interval_s <= 0:
        raise UsageError(f"the loop-lag probe's interval must be positive seconds: got {interval_s}")
    while True:
        asked = time.perf_counter()
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, time.perf_counter() - asked - interval_s))


def loop_lag_lifespan(histogram: Histogram, interval_s: float = INTERVAL_S
                      ) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """A FastAPI ``lifespan`` that runs ``watch_loop`` while the app serves."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: object) -> AsyncIterator[None]:
        probe = asyncio.get_running_loop().create_task(watch_loop(histogram, interval_s))
        try:
            yield
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe

    return lifespan
