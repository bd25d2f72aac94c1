"""Workers under a server-wide running limit: a worker claims nothing while the limit's jobs run."""

from __future__ import annotations

import pytest

from autoslapo.errors import UsageError
from autoslapo.service import Worker
from store import Store

REQUEST = {"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "sampler": "tpe", "baselines": False}


def test_a_worker_waits_while_the_limit_runs(service_store: Store) -> None:
    service_store.jobs.submit("held", {**REQUEST, "name": "held"})
    service_store.jobs.submit("next", {**REQUEST, "name": "next"})
    held = service_store.jobs.claim("elsewhere", 60)
    assert held is not None and held.study == "held"
    limited = Worker(service_store, lease_s=5, poll_s=0.1, max_running=1)
    assert limited.run(once=True) == 0
    assert service_store.jobs.get("next").status == "queued"
    assert service_store.jobs.finish(held.id, "elsewhere", "complete")
    assert limited.run(once=True) == 1
    assert service_store.jobs.get("next").status == "complete"
    assert len([t for t in service_store.trials("next") if t.status != "pruned"]) == 3


def test_a_limit_below_one_is_refused(service_store: Store) -> None:
    with pytest.raises(UsageError, match="--max-running must be at least 1: got 0"):
        Worker(service_store, max_running=0)
