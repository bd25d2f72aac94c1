"""The data that crosses boundaries: validated on construction, round-trips through dicts."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from autoslapo.cluster import DEVICES, ClusterSpec
from autoslapo.config import KNOBS, Knob, ScheduleConfig
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import PRESETS, ModelSpec
from autoslapo.redact import redact
from autoslapo.result import TrialResult
from search_spaces.space import canonical


def _knob_values(k: Knob) -> st.SearchStrategy:
    """Every value a knob may take, from its declaration (so a new knob is covered without an edit here)."""
    if k.domain:
        return st.sampled_from(k.domain)
    if k.kind == "ratio":
        return st.floats(0.0, 1.0)
    return st.integers(1, 16)


@st.composite
def configs(draw: st.DrawFn) -> ScheduleConfig:
    """Valid configurations over every declared knob: draws until the cross-knob rules hold."""
    knobs = canonical({k.name: draw(_knob_values(k)) for k in KNOBS}, layers=12)
    try:
        return ScheduleConfig(**knobs)
    except ConfigError:
        assume(False)
        raise


@given(configs())
def test_schedule_config_round_trips_through_json(cfg: ScheduleConfig) -> None:
    back = ScheduleConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    assert back.config_hash() == cfg.config_hash()


@given(configs(), st.integers(1, 96))
def test_checkpointed_layers_match_ratio(cfg: ScheduleConfig, layers: int) -> None:
    chosen = cfg.checkpointed_layers(layers)
    assert len(chosen) == len(set(chosen)) == round(cfg.ckpt_ratio * layers)
    assert all(0 <= i < layers for i in chosen)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip(name: str) -> None:
    spec = ModelSpec.from_name(name)
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_known_parameter_counts() -> None:
    # Published sizes: BERT-large 335M (340M incl. pooler/NSP), GPT-2 XL 1.5B, LLaMA-2 7B/70B.
    assert ModelSpec.from_name("bert").num_params() == pytest.approx(335e6, rel=0.02)
    assert ModelSpec.from_name("gpt2-xl").num_params() == pytest.approx(1.56e9, rel=0.02)
    assert ModelSpec.from_name("llama-7b").num_params() == pytest.approx(6.74e9, rel=0.02)
    assert ModelSpec.from_name("llama-70b").num_params() == pytest.approx(68.98e9, rel=0.02)


def test_unknown_model_names_close_matches() -> None:
    with pytest.raises(UsageError, match=r"did you mean.*bert-large"):
        ModelSpec.from_name("bert-larg")


def test_overrides_and_signature() -> None:
    base = ModelSpec.from_name("gpt2")
    big = base.with_overrides(hidden=1600, heads=25, layers=48)
    assert big.kv_heads == 25 and big.signature() != base.signature()
    assert ModelSpec.from_name("gpt2", seq_len=2048).max_positions == 2048
    with pytest.raises(UsageError, match="unknown model override"):
        base.with_overrides(depth=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (ScheduleConfig(tp=8, pp=2, dp=2), r"tp\*pp\*dp must equal --gpus: got tp=8, pp=2, dp=2 \(32\) for --gpus 64"),
        (ScheduleConfig(tp=3, dp=1), "tp must divide the attention heads"),
        (ScheduleConfig(pp=27), r"pipeline chunks must each hold a layer, but the first and the last \(the embeddings, "
         r"the head\): got 24 layers for pp=27 x virtual_stages=1"),
    ],
)
def test_validate_names_rule_and_values(cfg: ScheduleConfig, match: str) -> None:
    cluster = ClusterSpec(gpus=64) if "64" in match else None
    with pytest.raises(ConfigError, match=match):
        cfg.validate(ModelSpec.from_name("bert"), cluster)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="zero_stage"):
        ScheduleConfig(zero_stage=4)
    with pytest.raises(ConfigError, match="sequence_parallel needs tp > 1"):
        ScheduleConfig(sequence_parallel=True)
    with pytest.raises(ConfigError, match="cannot run with pipeline"):
        ScheduleConfig(pp=2, zero_stage=3)
    with pytest.raises(ConfigError, match="unknown schedule knobs"):
        ScheduleConfig.from_dict({"tp": 1, "tensor_parallel": 2})
    with pytest.raises(ConfigError, match="flash"):
        ScheduleConfig(attn_kernel="flash").validate(ModelSpec.from_name("bert-tiny"), ClusterSpec(1, "v100-32gb"))


@pytest.mark.parametrize("gpu_type", sorted(DEVICES))
def test_cluster_presets(gpu_type: str) -> None:
    c = ClusterSpec(gpus=16, gpu_type=gpu_type)
    assert c.memory_bytes > 0 and c.peak_tflops > 0 and c.nodes == 2
    assert ClusterSpec.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(("gpus", "per_node"), [(0, 8), (-4, 8), (12, 8), (8, 0)])
def test_cluster_rejects_impossible_counts(gpus: int, per_node: int) -> None:
    with pytest.raises(UsageError, match="--gpus"):
        ClusterSpec(gpus=gpus, gpus_per_node=per_node)


def test_trial_result_rules() -> None:
    r = TrialResult(status="complete", samples_per_s=3.0, final_loss=1.5)
    assert TrialResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(ConfigError):
        TrialResult(status="complete", samples_per_s=0.0)
    with pytest.raises(ConfigError, match="finite"):
        TrialResult(status="failed", final_loss=float("nan"))
    assert TrialResult.failure("oom", "out of memory\ntrace...").reason == "out of memory"


def test_redact_hides_passwords() -> None:
    s = redact("could not connect to postgresql+psycopg://alice:s3cr%40t@db:5432/x?password=zz")
    assert "s3cr" not in s and "zz" not in s and "alice:***@db" in s


def test_pure_modules_import_nothing_heavy() -> None:
    import subprocess

    code = (
        "import sys; import autoslapo.config, autoslapo.cluster, autoslapo.models.spec, autoslapo.result;"
        "bad=[m for m in ('torch','ray','sqlalchemy','transformers','optuna') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
