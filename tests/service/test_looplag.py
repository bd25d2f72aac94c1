"""The server's event-loop lag probe: it sees a blocked loop, and its histogram is in /metrics."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from autoslapo.errors import UsageError
from autoslapo.service.looplag import loop_lag_histogram, watch_loop
from tests.service.conftest import bearer


def _sample(registry: CollectorRegistry, suffix: str, **labels: str) -> float:
    value = registry.get_sample_value(f"autoslapo_event_loop_lag_seconds_{suffix}", labels)
    assert value is not None
    return value


def test_the_probe_records_a_loop_blocked_for_100_ms() -> None:
    registry = CollectorRegistry()
    histogram = loop_lag_histogram(registry)

    async def scenario() -> None:
        probe = asyncio.get_running_loop().create_task(watch_loop(histogram, 0.005))
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # a callback that holds the loop, as a blocking call on it would
        await asyncio.sleep(0.05)
        probe.cancel()

    asyncio.run(scenario())
    count = _sample(registry, "count")
    assert count >= 3
    assert _sample(registry, "bucket", le="0.05") <= count - 1, "the 100 ms stall is not above 50 ms"
    assert _sample(registry, "sum") >= 0.09


def test_the_probe_refuses_a_non_positive_interval() -> None:
    with pytest.raises(UsageError, match="positive"):
        asyncio.run(watch_loop(loop_lag_histogram(CollectorRegistry()), 0.0))


def test_metrics_shows_the_servers_loop_lag(client: TestClient, tokens: dict[str, str]) -> None:
    deadline = time.monotonic() + 10
    count = 0.0
    while time.monotonic() < deadline and count < 3:
        text = client.get("/metrics", headers=bearer(tokens["read"])).text
        found = re.search(r"^autoslapo_event_loop_lag_seconds_count (\S+)$", text, re.MULTILINE)
        count = float(found.group(1)) if found else 0.0
        time.sleep(0.05)
    assert count >= 3, "the app's lifespan did not start the loop-lag probe"
