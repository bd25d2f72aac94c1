"""Real trials: a tiny model tuned on 2 CPU ranks, inline and through Ray (slow: real training)."""

from __future__ import annotations

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from search_spaces import space_from_dict
from store import Store
from tuner import TuneOptions, tune

TINY = ModelSpec.from_name("bert-tiny")
CPU2 = ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2)
# Data parallel knobs only: what two gloo ranks on two cores run in seconds.
SPACE = space_from_dict({"name": "dp-only", "knobs": {"micro_batch": [2, 4, 8], "zero_stage": [0, 1]},
                         "fixed": {"tp": 1, "pp": 1, "attn_kernel": "sdpa"}})


def _check(store: Store, study: str, n: int) -> None:
    rows = [t for t in store.trials(study) if t.status != "pruned"]
    assert len(rows) == n and len({t.config_hash for t in rows}) == n
    done = [t for t in rows if t.status == "complete"]
    assert done, [t.reason for t in rows]
    assert all(t.measured and (t.samples_per_s or 0) > 0 and (t.step_time_s or 0) > 0 for t in done)


@pytest.mark.slow
def test_local_tune_runs_real_trials(store: Store) -> None:
    out = tune(TuneOptions(model=TINY, cluster=CPU2, backend="local", trials=2, space=SPACE, steps=3,
                           baselines=False, study="local"), store)
    assert out.launched == 2
    _check(store, "local", 2)


@pytest.mark.slow
@pytest.mark.ray
def test_ray_backend_runs_real_trials(store: Store) -> None:
    out = tune(TuneOptions(model=TINY, cluster=CPU2, backend="ray", dispatch="ray", trials=2, space=SPACE,
                           steps=3, baselines=False, study="rayl", max_concurrent=1), store)
    assert out.launched == 2
    _check(store, "rayl", 2)
