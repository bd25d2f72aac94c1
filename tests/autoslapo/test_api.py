"""``autoslapo.api``: best() from the store, and apply_best() on two real gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoslapo.api import apply_best, best, best_trial
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec

GiB = 1024**3

# bert-tiny on 2 CPU ranks. The fastest is tensor-parallel so that apply_best must shard; the
# measured one is slower; the lightest leaves the most memory free.
FAST = ScheduleConfig(tp=2, dp=1, micro_batch=2, grad_accum=2, attn_kernel="eager", precision="fp32")
MEASURED = ScheduleConfig(dp=2, micro_batch=2, zero_stage=1, attn_kernel="eager", precision="fp32")
LIGHT = ScheduleConfig(dp=2, micro_batch=1, grad_accum=2, ckpt_ratio=1.0, attn_kernel="eager", precision="fp32")
# the best on 2 V100s (no bf16): an fp16 pipeline, trained with the runtime's loss scaling
HALF = ScheduleConfig(pp=2, micro_batch=2, grad_accum=2, attn_kernel="eager", precision="fp16")


def make_store(url: str) -> None:
    from store import open_store

    spec = ModelSpec.from_name("bert-tiny")
    cluster = ClusterSpec(2, gpu_type="cpu")
    with open_store(url) as db:
        db.create_study("tiny", model=spec.to_dict(), cluster=cluster.to_dict(), space_name="bert",
                        space_version="1", objective="samples_per_s", backend="sim",
                        model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        rows = [(FAST, 300.0, 11.5 * GiB, False), (MEASURED, 200.0, 9.0 * GiB, True),
                (LIGHT, 100.0, 2.0 * GiB, False)]
        for i, (config, value, memory, measured) in enumerate(rows):
            db.add_trial("tiny", i, config.to_dict(), {"status": "complete", "samples_per_s": value,
                                                       "peak_memory_bytes": int(memory), "measured": measured})
        db.add_trial("tiny", 3, ScheduleConfig(dp=2, micro_batch=64).to_dict(),
                     {"status": "oom", "reason": "out of memory"})
        v100 = ClusterSpec(2, gpu_type="v100-32gb")
        db.create_study("tiny-v100", model=spec.to_dict(), cluster=v100.to_dict(), space_name="bert",
                        space_version="1", objective="samples_per_s", backend="sim",
                        model_signature=spec.signature(), cluster_fingerprint=v100.fingerprint())
        db.add_trial("tiny-v100", 0, HALF.to_dict(), {"status": "complete", "samples_per_s": 50.0,
                                                      "peak_memory_bytes": 31 * GiB, "measured": False})


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"sqlite:///{tmp_path / 'api.db'}"
    make_store(u)
    return u


def test_best_returns_the_fastest_config(url: str) -> None:
    assert best("bert-tiny", gpus=2, storage=url) == FAST
    assert best(ModelSpec.from_name("bert-tiny"), gpus=2, gpu_type="cpu", storage=url) == FAST
    assert best_trial("bert-tiny", gpus=2, storage=url).samples_per_s == 300.0


def test_best_filters(url: str) -> None:
    assert best("bert-tiny", gpus=2, storage=url, measured_only=True) == MEASURED
    # 12 GiB devices: FAST peaks at 11.5 GiB (0.5 free), MEASURED at 9 (3 free), LIGHT at 2 (10 free).
    assert best("bert-tiny", gpus=2, storage=url, min_headroom_bytes=1 * GiB) == MEASURED
    assert best("bert-tiny", gpus=2, storage=url, min_headroom_fraction=0.5) == LIGHT


@pytest.mark.parametrize("kwargs, needle", [
    ({"gpus": 4}, "run `autoslapo tune bert-tiny --gpus 4`"),
    ({"gpus": 2, "gpu_type": "a100-80gb"}, "2 x a100-80gb"),
    ({"gpus": 2, "min_headroom_fraction": 0.95}, "passes the filters"),
    ({"gpus": 0}, "gpus must be a positive integer"),
    ({"gpus": 2, "gpu_type": "tpu-v9"}, "gpu_type must be one of"),
    ({"gpus": 2, "gpus_per_node": 1}, "2 x any device (1 a node) in"),
    ({"gpus": 2, "gpus_per_node": 1}, "`autoslapo tune bert-tiny --gpus 2 --gpus-per-node 1` first"),
    ({"gpus": 2, "links": {"inter_node_gbps": 6.25}}, "`autoslapo tune bert-tiny --gpus 2 --inter-node-gbps 6.25`"),
])
def test_best_says_what_to_do_when_nothing_matches(url: str, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(UsageError) as err:
        best("bert-tiny", storage=url, **kwargs)
    assert needle in str(err.value)


def test_best_keeps_to_a_node_size_when_asked(url: str) -> None:
    assert best("bert-tiny", gpus=2, storage=url, gpus_per_node=8) == FAST  # the studies' clusters: 8 a node


def test_best_of_a_name_no_study_has_says_so(url: str) -> None:
    with pytest.raises(UsageError, match="model must be a preset, a model file or a model a stored study tuned: "
                                         "got 'no-such-model'"):
        best("no-such-model", gpus=2, storage=url)


def test_best_on_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "none.db"
    with pytest.raises(UsageError, match="no store at"):
        best("bert", gpus=64, storage=f"sqlite:///{target}")
    assert not target.exists()


def test_apply_best_needs_a_launched_job(url: str) -> None:
    from autoslapo.api import apply_best

    with pytest.raises(UsageError, match="inside a launched job of 2 ranks"):
        apply_best("bert-tiny", gpus=2, storage=url)


def _train_two_steps(url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    from autoslapo.api import apply_best
    from autoslapo.models.build import example_batch

    job = apply_best("bert-tiny", gpus=2, storage=url, lr=1e-2, **kwargs)
    cfg = job.config
    losses = []
    for _ in range(3):
        batch = example_batch(job.spec, cfg.global_batch, seed=0)  # one batch, repeated: the loss must fall
        losses.append(job.step(batch))
    with pytest.raises(UsageError, match=r"split into dp x grad_accum"):
        job.step(example_batch(job.spec, cfg.dp * cfg.grad_accum + 1, seed=0))
    local_params = sum(p.numel() for p in job.model.parameters())
    return {"config": cfg.to_dict(), "losses": losses, "params": local_params, "tp": job.groups.tp,
            "plan_tp": job.plan.get("tp"), "trial": job.trial.number}


def _train_fp16_pipeline(url: str) -> dict[str, Any]:
    from autoslapo.api import apply_best
    from autoslapo.models.build import example_batch

    job = apply_best("bert-tiny", gpus=2, gpu_type="v100-32gb", storage=url, lr=1e-2)
    losses = []
    for _ in range(3):
        with job.autocast():
            losses.append(job.step(example_batch(job.spec, job.config.global_batch, seed=0)))
    return {"config": job.config.to_dict(), "losses": losses, **job.scaler.state()}


def _both(url: str) -> list[dict[str, Any]]:
    # One launch for every look-up: starting ranks (and importing DeepSpeed) is most of the cost.
    return [_train_two_steps(url, {}), _train_two_steps(url, {"measured_only": True}), _train_fp16_pipeline(url)]


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_apply_best_trains_the_tuned_schedule_on_two_ranks(url: str) -> None:
    from autoslapo.dist import spawn

    ranks = spawn(_both, 2, url, timeout=300.0)
    tp_out = [r[0] for r in ranks]
    dp_out = [r[1] for r in ranks]
    assert all(r["config"] == FAST.to_dict() and r["trial"] == 0 for r in tp_out)
    assert all(r["tp"] == 2 and r["plan_tp"] == 2 for r in tp_out)
    assert tp_out[0]["losses"] == tp_out[1]["losses"]
    assert tp_out[0]["losses"][-1] < tp_out[0]["losses"][0]

    assert all(r["config"] == MEASURED.to_dict() and r["trial"] == 1 for r in dp_out)
    assert dp_out[0]["losses"] == dp_out[1]["losses"]
    assert dp_out[0]["losses"][-1] < dp_out[0]["losses"][0]
    # Tensor parallelism shards the layers: each tp rank holds fewer parameters than a dp replica.
    assert tp_out[0]["params"] < dp_out[0]["params"]
    # fp16 on two pipeline stages: the loss scaled (2**16, no overflow), learning, both ranks agreeing
    half = [r[2] for r in ranks]
    assert all(r["config"] == HALF.to_dict() and r["loss_scale"] == 2.0**16 for r in half)
    assert half[0]["losses"] == half[1]["losses"] and half[0]["skipped_steps"] == 0
    assert half[0]["losses"][-1] < half[0]["losses"][0]


@pytest.mark.parametrize("kwargs", [{"min_headroom_bytes": 10**9}, {"storage": "sqlite://"},
                                    {"min_headroom_fraction": 0.1}])
def test_filters_the_service_does_not_take_are_refused_with_a_server(kwargs: dict[str, Any]) -> None:
    """They were dropped without a word: apply_best(..., server=, gpus_per_node=7) answered unfiltered.
    Refused before anything is sent (nothing listens on port 9)."""
    with pytest.raises(UsageError, match=f"with server= the service answers from its store: {next(iter(kwargs))} "):
        best("bert", gpus=8, server="http://127.0.0.1:9", **kwargs)
    with pytest.raises(UsageError, match="cannot be sent; drop it,"):  # one filter: it
        apply_best("bert", gpus=8, server="http://127.0.0.1:9", **kwargs)
    with pytest.raises(UsageError, match="min_headroom_bytes, min_headroom_fraction cannot be sent; drop them,"):
        best("bert", gpus=8, server="http://127.0.0.1:9", min_headroom_bytes=10**9, min_headroom_fraction=0.1)


def test_a_model_named_by_its_signature_is_built_from_its_study(tmp_path: Path) -> None:
    """The service's apply_best line names a config.json's model by its signature: the look-up found the
    study, then apply_best failed to build "unknown model '<signature>'"; it builds the study's model."""
    from autoslapo.models.resolve import resolve_model
    from store import open_store
    from tuner import TuneOptions, tune

    config = Path(__file__).parent / "data" / "hf" / "mistral-tiny.json"
    spec, url = resolve_model(str(config)), f"sqlite:///{tmp_path / 's.db'}"
    with open_store(url) as db:
        tune(TuneOptions(model=spec, cluster=ClusterSpec(gpus=2, gpu_type="cpu"), trials=2, baselines=False), db)
    assert best(spec.signature(), gpus=2, storage=url) == best(str(config), gpus=2, storage=url)
    with pytest.raises(UsageError, match=r"call torch\.distributed\.init_process_group"):  # found and built
        apply_best(spec.signature(), gpus=2, storage=url)
    # another node size: no schedule of that model (it said the model was none a stored study tuned)
    with pytest.raises(UsageError, match=r"no recorded schedule for .* \(1 a node\)"):
        best(spec.signature(), gpus=2, storage=url, gpus_per_node=1)
    with pytest.raises(UsageError, match="no-such-model"):
        apply_best("no-such-model", gpus=2, storage=url)
