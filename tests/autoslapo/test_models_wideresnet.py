"""WideResNet written in the project (``autoslapo.models.wideresnet``, presets in ``autoslapo.models.zoo``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.resolve import resolve_model
from autoslapo.models.user import user_loss
from autoslapo.models.wideresnet import WideResNet, wideresnet_params
from autoslapo.plan import apply_schedule
from search_spaces import space_for

# torchvision's wide_resnet50_2: 68,883,240 parameters, 11.40 GFLOPS (multiply-adds) at 224x224
WRN50_2_PARAMS = 68_883_240
WRN50_2_GMACS = 11.40


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_architecture_has_torchvisions_parameter_count() -> None:
    with torch.device("meta"):
        assert sum(p.numel() for p in WideResNet().parameters()) == WRN50_2_PARAMS == wideresnet_params()
        for k, depths in ((3, (3, 4, 6, 3)), (4, (3, 4, 6, 3)), (2, (1, 1))):
            n = sum(p.numel() for p in WideResNet(depths, k, 10, 16).parameters())
            assert n == wideresnet_params(depths, k, 10, 16)


def test_the_published_size_resolves_with_its_parameters_and_flops() -> None:
    spec = resolve_model("wideresnet-50")
    assert (spec.preset, spec.num_params(), spec.layers) == ("wideresnet-50", WRN50_2_PARAMS, 16)
    assert spec.extra["fwd_flops"] / 2e9 == pytest.approx(WRN50_2_GMACS, rel=0.01)
    assert spec.heads == 128  # tp must divide every stage's inner width: 128, 256, 512, 1024
    wide = resolve_model("wideresnet-50-4")
    assert wide.num_params() == wideresnet_params(width_factor=4) > spec.num_params()
    with pytest.raises(UsageError, match="shape flags do not apply to wideresnet-50"):
        resolve_model("wideresnet-50", hidden=512)
    est = estimate(spec, ScheduleConfig(dp=8, micro_batch=32), ClusterSpec(gpus=8, gpu_type="a100-80gb"))
    assert est.fits and est.samples_per_s > 0 and est.memory.params == WRN50_2_PARAMS * 2
    with pytest.raises(ConfigError, match="share the divisor 128"):
        ScheduleConfig(tp=3, dp=1).validate(spec)
    # channel-sharded TP and checkpointing are searched; attention kernels and fusion are not (no attention)
    bound = space_for("user").bind(spec, ClusterSpec(gpus=8, gpu_type="a100-80gb"))
    assert bound.domains["tp"] == (1, 2, 4, 8) and len(bound.domains["ckpt_ratio"]) == 5
    assert bound.domains["attn_kernel"] == ("sdpa",) and bound.domains["fuse_bias_gelu"] == (False,)


def test_checkpointing_by_ratio_keeps_loss_and_gradients() -> None:
    spec = resolve_model("wideresnet-tiny")
    ref, model = build_model(spec, seed=2), build_model(spec, seed=2)
    sch = apply_schedule(model, spec, ScheduleConfig(ckpt_ratio=0.5))
    assert sch.meta["plan"]["checkpointed"] == [0]
    batch = example_batch(spec, 4, seed=1)
    assert batch["images"].shape == (4, 3, 32, 32) and batch["labels"].shape == (4,)
    want, got = user_loss(ref(**batch)), user_loss(model(**batch))
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_verify_tp2_channel_shards_every_bottleneck(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "AUTOSLAPO_MODEL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "autoslapo", "verify", "wideresnet-tiny", "--tp", "2"],
                          capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "verify wideresnet-tiny: ok - tp=2 pp=1" in out and "74,970 parameters" in out, out


@pytest.mark.slow
def test_a_local_trial_measures_close_to_the_cost_model(tmp_path: Path) -> None:
    import os

    from store import open_store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "AUTOSLAPO_MODEL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "autoslapo", "tune", "wideresnet-tiny", "--gpus", "2", "--backend",
                           "local", "--trials", "2", "--steps", "3", "--repeats", "0", "--no-baselines", "--storage",
                           url], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = open_store(url)
    (study,) = store.list_studies()
    trials = [t for t in store.trials(study.name) if t.status == "complete"]
    assert trials and study.model_name == "wideresnet-tiny"
    for t in trials:  # the prediction stored next to each measurement on the CPU ranks
        extra = t.result["extra"]
        assert 0.5 < extra["predicted_memory_bytes"] / t.peak_memory_bytes < 2, extra
        assert 1 / 3 < extra["predicted_samples_per_s"] / t.samples_per_s < 3, extra
