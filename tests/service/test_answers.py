"""The answer cache behind GET /v1/best and GET /v1/studies: bounded staleness, one refresh at a time,
errors never kept; and the best answer follows a new better trial."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.cost import best_config
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.service import ServiceSettings, create_app
from autoslapo.service.answers import AnswerCache
from store import Store
from tests.service.conftest import bearer
from tests.service.test_auth import Clock


class Source:
    """A value that changes when the test says so, counting how often it was read."""

    def __init__(self) -> None:
        self.value = 1
        self.reads = 0
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> int:
        self.gate.wait(10)
        self.reads += 1
        if self.fail:
            raise RuntimeError("store down")
        return self.value


def test_fresh_answers_come_from_memory_then_one_background_refresh() -> None:
    async def scenario() -> None:
        clock, source = Clock(), Source()
        cache = AnswerCache(fresh_s=1.0, stale_s=10.0, clock=clock)
        assert await cache.get("k", source) == 1 and source.reads == 1
        source.value = 2
        assert [await cache.get("k", source) for _ in range(5)] == [1] * 5 and source.reads == 1
        clock.now += 1.5  # stale: answered at once with the old value, one refresh starts
        source.gate.clear()
        assert [await cache.get("k", source) for _ in range(5)] == [1] * 5
        source.gate.set()
        for _ in range(200):
            if await cache.get("k", source) == 2:
                break
            await asyncio.sleep(0.01)
        assert await cache.get("k", source) == 2 and source.reads == 2  # one refresh, not five
        source.value = 3
        clock.now += 20  # past stale_s: the caller waits for a fresh answer
        assert await cache.get("k", source) == 3
        assert await cache.get("other", source) == 3 and source.reads == 4  # keys are separate
        source.value = 4
        cache.expire()  # after a write: still served once, and a refresh starts
        assert await cache.get("k", source) == 3
        for _ in range(200):
            if await cache.get("k", source) == 4:
                break
            await asyncio.sleep(0.01)
        assert await cache.get("k", source) == 4

    asyncio.run(scenario())


def test_concurrent_misses_share_one_read_and_errors_are_not_kept() -> None:
    async def scenario() -> None:
        source = Source()
        cache = AnswerCache(fresh_s=1.0, stale_s=10.0, clock=Clock())
        source.gate.clear()
        waiting = [asyncio.ensure_future(cache.get("k", source)) for _ in range(10)]
        await asyncio.sleep(0.05)
        source.gate.set()
        assert await asyncio.gather(*waiting) == [1] * 10 and source.reads == 1
        failing = AnswerCache(fresh_s=1.0, stale_s=10.0, clock=Clock())
        source.fail = True
        with pytest.raises(RuntimeError, match="store down"):
            await failing.get("k", source)
        source.fail = False
        assert await failing.get("k", source) == 1  # asked again, not the kept error

    asyncio.run(scenario())


def test_no_cache_reads_every_time_and_keys_are_bounded() -> None:
    async def scenario() -> None:
        source = Source()
        off = AnswerCache(fresh_s=0)
        assert [await off.get("k", source) for _ in range(3)] == [1, 1, 1] and source.reads == 3
        small = AnswerCache(max_keys=2, clock=Clock())
        for key in ("a", "b", "c"):
            await small.get(key, source)
        await small.get("a", source)  # "a" was dropped for "c": read again
        assert source.reads == 7
        with pytest.raises(UsageError, match="fresh_s <= stale_s"):
            AnswerCache(fresh_s=5, stale_s=1)

    asyncio.run(scenario())


def _study(store: Store, name: str) -> dict[str, Any]:
    spec, cluster = ModelSpec.from_name("bert"), ClusterSpec(gpus=8, gpu_type="a100-80gb")
    store.create_study(name, model=spec.to_dict(), cluster=cluster.to_dict(), space_name="test", space_version="1",
                       objective="samples_per_s", backend="sim", model_signature=spec.signature(),
                       cluster_fingerprint=cluster.fingerprint())
    return best_config(spec, cluster).to_dict()


def _result(samples_per_s: float) -> dict[str, Any]:
    return {"status": "complete", "samples_per_s": samples_per_s, "tokens_per_s": samples_per_s * 512,
            "peak_memory_bytes": 2**30, "measured": False}


@pytest.mark.parametrize("cache_s", [0.0, pytest.param(0.2, marks=pytest.mark.slow)])
def test_best_answer_follows_a_new_better_trial(service_store: Store, tokens: dict[str, str], cache_s: float) -> None:
    config = _study(service_store, "one")
    service_store.add_trial("one", 0, config, _result(100.0))
    params, auth = {"model": "bert", "gpus": 8, "gpu_type": "a100-80gb"}, bearer(tokens["read"])
    with TestClient(create_app(service_store, ServiceSettings(answer_cache_s=cache_s))) as client:
        first = client.get("/v1/best", params=params, headers=auth)
        assert first.status_code == 200 and (first.json()["study"], first.json()["trial"]) == ("one", 0)
        assert client.get("/v1/studies", headers=auth).json()["studies"][0]["best"]["number"] == 0
        _study(service_store, "two")
        service_store.add_trial("two", 0, config, _result(250.0))
        end = time.monotonic() + 30  # the documented bound is answer_cache_s plus one refresh
        seen = first.json()
        while (seen["study"], seen["trial"]) != ("two", 0) and time.monotonic() < end:
            time.sleep(0.05)
            seen = client.get("/v1/best", params=params, headers=auth).json()
        assert (seen["study"], seen["samples_per_s"]) == ("two", 250.0)
        listed = {s["name"]: s for s in client.get("/v1/studies", headers=auth).json()["studies"]}
        while "two" not in listed and time.monotonic() < end:
            time.sleep(0.05)
            listed = {s["name"]: s for s in client.get("/v1/studies", headers=auth).json()["studies"]}
        assert listed["two"]["best"]["samples_per_s"] == 250.0 and listed["two"]["counts"] == {"complete": 1}
        missing = client.get("/v1/best", params={**params, "gpus": 16}, headers=auth)
        assert missing.status_code == 404 and "no study on this server has a recorded schedule" in missing.json()["error"]
