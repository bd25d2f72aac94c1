"""The per-cluster correction of the cost model: fit, bounds, memory evidence, round-trip."""

from __future__ import annotations

import random

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import device_perf, estimate
from autoslapo.cost.correction import (
    BOUND,
    Correction,
    Observation,
    corrected_cluster,
    corrected_perf,
    fit_correction,
)
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from search_spaces import space_for

MODEL = ModelSpec.from_name("gpt2-xl")
CLUSTER = ClusterSpec(gpus=16, gpu_type="a100-80gb")
BASE = device_perf(CLUSTER)


def _configs(n: int, seed: int = 0) -> list[ScheduleConfig]:
    configs = list(space_for(MODEL.family).bind(MODEL, CLUSTER).configs())
    return random.Random(seed).sample(configs, n)


def _measure(truth: Correction, configs: list[ScheduleConfig], *, cluster: ClusterSpec = CLUSTER) -> list[Observation]:
    perf = truth.apply(BASE)
    out = []
    for c in configs:
        e = estimate(MODEL, c, truth.apply_cluster(cluster), perf=perf, validate=False)
        out.append(Observation(MODEL, c, cluster, "complete", e.samples_per_s, e.memory_per_device_bytes)
                   if e.fits else Observation(MODEL, c, cluster, "oom", oom_evidence=True))
    return out


def test_no_observation_leaves_the_model_as_it_is() -> None:
    assert fit_correction([], BASE) == Correction()
    assert Correction().apply(BASE) is BASE


def test_recovers_planted_compute_and_activation_factors() -> None:
    truth = Correction(compute=0.6, activation=1.6)
    got = fit_correction(_measure(truth, _configs(24)), BASE, prior_weight=0.01)
    assert got.compute == pytest.approx(0.6, rel=0.08)
    assert got.activation == pytest.approx(1.6, rel=0.05)
    for name in ("memory_bw", "intra_bw", "inter_bw", "latency", "overhead"):  # planted at 1: they stay near it
        assert 0.7 < getattr(got, name) < 1.4, got


@pytest.mark.slow
def test_few_points_move_the_factors_less_than_many() -> None:
    truth = Correction(compute=0.5)
    one = fit_correction(_measure(truth, _configs(1)), BASE)
    many = fit_correction(_measure(truth, _configs(20)), BASE)
    assert 0.5 < one.compute < 1.0  # the ridge toward 1 holds a single point back
    assert abs(many.compute - 0.5) < abs(one.compute - 0.5)


def test_factors_stay_within_their_bounds() -> None:
    obs = [Observation(o.model, o.config, o.cluster, o.status,
                       None if o.samples_per_s is None else o.samples_per_s * 50, o.peak_memory_bytes)
           for o in _measure(Correction(), _configs(8))]
    got = fit_correction(obs, BASE, prior_weight=0.0)
    assert all(1 / BOUND <= v <= BOUND for v in got.to_dict().values())
    assert max(got.compute, got.memory_bw, got.intra_bw, got.inter_bw) == pytest.approx(BOUND, rel=1e-3)
    with pytest.raises(ConfigError, match=r"compute must lie in \[0.25, 4\]: got 5"):
        Correction(compute=5.0)


def _fits_barely() -> ScheduleConfig:
    """A configuration the model predicts to fit, using most of the device."""
    ests = [estimate(MODEL, c, CLUSTER, perf=BASE, validate=False) for c in _configs(400, seed=1)]
    fitting = [e for e in ests if e.fits and e.memory.activations > 0.3 * e.memory_per_device_bytes]
    return max(fitting, key=lambda e: e.memory_per_device_bytes).config


def test_an_oom_moves_the_memory_factor_only_with_evidence() -> None:
    config = _fits_barely()
    silent = Observation(MODEL, config, CLUSTER, "oom", oom_evidence=False)
    assert fit_correction([silent], BASE) == Correction()
    shown = fit_correction([Observation(MODEL, config, CLUSTER, "oom", oom_evidence=True)], BASE)
    assert shown.activation > 1.0
    assert all(getattr(shown, k) == 1.0 for k in ("compute", "memory_bw", "intra_bw", "inter_bw", "latency",
                                                  "overhead"))
    before = estimate(MODEL, config, CLUSTER, perf=BASE, validate=False).memory_per_device_bytes
    after = estimate(MODEL, config, CLUSTER, perf=shown.apply(BASE), validate=False).memory_per_device_bytes
    assert after > before  # the ridge holds one point back; with little ridge it is pushed past capacity
    loose = fit_correction([Observation(MODEL, config, CLUSTER, "oom", oom_evidence=True)], BASE, prior_weight=0.01)
    assert estimate(MODEL, config, CLUSTER, perf=loose.apply(BASE), validate=False).memory_per_device_bytes \
        > CLUSTER.memory_bytes


def test_a_run_that_completes_where_the_model_said_no_lowers_the_memory_factor() -> None:
    small = ClusterSpec(gpus=16, gpu_type="a100-80gb", memory_bytes=20 * 2**30)
    ests = [estimate(MODEL, c, small, perf=BASE, validate=False) for c in _configs(400, seed=2)]
    refused = min((e for e in ests if not e.fits and e.memory.activations > 0.5 * e.memory_per_device_bytes),
                  key=lambda e: e.memory_per_device_bytes)
    ran = Observation(MODEL, refused.config, small, "complete", samples_per_s=refused.samples_per_s)
    got = fit_correction([ran], BASE)
    assert got.activation < 1.0
    assert estimate(MODEL, refused.config, small, perf=got.apply(BASE), validate=False).memory_per_device_bytes \
        < refused.memory_per_device_bytes


def test_round_trip_and_corrected_perf() -> None:
    c = Correction(compute=0.8, memory_bw=1.2, intra_bw=0.5, inter_bw=1.5, latency=0.7, overhead=2.0, activation=1.3)
    assert Correction.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="unknown correction factors"):
        Correction.from_dict({"flops": 1.0})
    perf = corrected_perf(CLUSTER, c.to_dict())
    assert perf.gemm_eff == pytest.approx(BASE.gemm_eff * 0.8) and perf.comm_eff == BASE.comm_eff
    assert perf.op_latency_s == pytest.approx(BASE.op_latency_s * 0.7)
    assert perf.step_overhead_s == pytest.approx(BASE.step_overhead_s * 2.0)
    assert perf.activation_slack == pytest.approx(BASE.activation_slack * 1.3)
    links = corrected_cluster(CLUSTER, c)
    assert links.intra_node_gbps == pytest.approx(CLUSTER.intra_node_gbps * 0.5)
    assert links.inter_node_gbps == pytest.approx(CLUSTER.inter_node_gbps * 1.5)
    assert links.memory_bytes == CLUSTER.memory_bytes
    assert corrected_perf(CLUSTER, None) == BASE and corrected_cluster(CLUSTER, None) is CLUSTER


def test_a_calibration_stored_with_one_comm_factor_reads_as_both_links() -> None:
    old = Correction.from_dict({"compute": 0.9, "memory_bw": 1.0, "comm": 0.6, "overhead": 1.3, "activation": 1.1})
    assert (old.intra_bw, old.inter_bw, old.latency, old.overhead) == (0.6, 0.6, 1.3, 1.3)


def test_recovers_a_planted_network_bandwidth_apart_from_the_node_links() -> None:
    """A cluster whose network is slower than its preset (and compute faster): the inter-node
    factor moves on its own; the intra-node one, planted at 1, stays (multi-node layouts use both
    links, and GPT-2 XL's tensor-parallel traffic over NVLink moves its step time by ~1 % only)."""
    truth = Correction(compute=1.25, inter_bw=0.5)
    cluster = ClusterSpec(gpus=32, gpu_type="a100-80gb")
    configs = random.Random(3).sample(list(space_for(MODEL.family).bind(MODEL, cluster).configs()), 40)
    got = fit_correction(_measure(truth, configs, cluster=cluster), BASE, prior_weight=0.01)
    assert got.compute == pytest.approx(1.25, rel=0.1)
    assert got.inter_bw == pytest.approx(0.5, rel=0.2)
    assert got.intra_bw == pytest.approx(1.0, rel=0.2)
