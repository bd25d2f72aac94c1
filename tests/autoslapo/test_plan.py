"""apply_schedule: one knob-driven schedule for every family, verified on real gloo ranks.

One spawned 2-rank world runs every distributed check (spawning costs more than the checks) and
returns a verdict per case; the tests below read them. Models are float64 so that only a wrong
schedule, not summation order, can make a gradient differ.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoslapo.config import ScheduleConfig
from autoslapo.dist import build_groups, init_fake_world, spawn
from autoslapo.errors import ConfigError, ScheduleError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import FAMILIES, ModelSpec
from autoslapo.plan import apply_schedule, checkpointed_layers, chunk_bounds, cut_points

TP_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"tp2-{f}": (f"{f}-tiny", {"tp": 2}) for f in sorted(FAMILIES)},
    "tp2-sp-ckpt-gpt2": ("gpt2-tiny", {"tp": 2, "sequence_parallel": True, "ckpt_ratio": 0.5}),
    "tp2-sp-llama": ("llama-tiny", {"tp": 2, "sequence_parallel": True}),
    "tp2-sp-opt": ("opt-tiny", {"tp": 2, "sequence_parallel": True}),
    "tp2-fuse-ckpt-bert": (
        "bert-tiny",
        {"tp": 2, "fuse_bias_gelu": True, "ckpt_ratio": 1.0, "attn_kernel": "eager"},
    ),
    "tp2-fuse-gpt2": ("gpt2-tiny", {"tp": 2, "fuse_bias_gelu": True}),
    # T5: both stacks, cross-attention and relative-position tables sharded; every block recomputed
    "tp2-selective-t5": ("t5-tiny", {"tp": 2, "ckpt_ratio": 1.0, "ckpt_granularity": "selective",
                                     "attn_kernel": "eager"}),
    # ALBERT's one shared layer: sharded once, its calls checkpointed (selectively here)
    "tp2-ckpt-albert": ("albert-tiny", {"tp": 2, "ckpt_ratio": 0.5}),
    "tp2-selective-albert": ("albert-tiny", {"tp": 2, "ckpt_ratio": 0.75, "ckpt_granularity": "selective"}),
    "tp2-sp-ckpt-fuse-gpt_neo": (
        "gpt-neo-tiny", {"tp": 2, "sequence_parallel": True, "ckpt_ratio": 0.5, "fuse_bias_gelu": True}),
}
CAUSAL = ("gpt2", "gpt_neo", "llama", "opt")
PP_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "pp2-ckpt-bert": ("bert-tiny", {"pp": 2, "grad_accum": 2, "ckpt_ratio": 1.0}),
    "pp2-ckpt-gpt2": (
        "gpt2-tiny",
        {"pp": 2, "grad_accum": 2, "ckpt_ratio": 1.0, "pipeline_schedule": "gpipe"},
    ),
    "pp2-ckpt-gpt_neo": ("gpt-neo-tiny", {"pp": 2, "grad_accum": 2, "ckpt_ratio": 1.0}),
}


def _verify_tp(name: str, knobs: dict[str, Any], groups: Any, broken: str | None = None,
               dtype: torch.dtype = torch.float64) -> str:
    """Verify at ``dtype``. With labels the scheduled model computes its loss vocabulary-parallel;
    transformers computes a causal LM's loss in fp32 (``logits.float()``), so at float64 a causal
    model is checked without labels (whole logits) and its loss path in a float32 case."""
    from autoslapo.models import families
    from autoslapo.schedule import create_schedule
    from autoslapo.verify import Verify

    spec = ModelSpec.from_name(name)
    config = ScheduleConfig(**knobs)
    model = build_model(spec, seed=5, dtype=dtype, dropout=0.0)
    batch = example_batch(spec, 2, 16, seed=6)
    if spec.causal and dtype == torch.float64:
        batch.pop("labels")
    sch = create_schedule(model, group=groups.tp_group)
    saved = families.FAMILY_DESCRIPTIONS.get(spec.family)  # None: a convolutional family (no description)
    if broken is not None and saved is not None:  # a description that forgets what the forward needs must be caught
        families.FAMILY_DESCRIPTIONS[spec.family] = dataclasses.replace(saved, **{broken: ()})
    try:
        with Verify(sch, batch) as v:
            apply_schedule(sch, spec, config, groups, compiler="eager")
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        if saved is not None:
            families.FAMILY_DESCRIPTIONS[spec.family] = saved
    params = sum(1 for c in v.checked if c.startswith("gradient of"))
    return f"ok {params} gradients"


def _verify_pp(name: str, knobs: dict[str, Any], groups: Any) -> str:
    from autoslapo.cli.verify import _verify_pipeline
    from autoslapo.schedule import create_schedule

    spec = ModelSpec.from_name(name)
    config = ScheduleConfig(**knobs)
    model = build_model(spec, seed=5, dtype=torch.float64, dropout=0.0)
    batch = example_batch(spec, 4, 16, seed=6)
    sch = apply_schedule(create_schedule(model, group=groups.tp_group), spec, config, groups)
    from autoslapo.models.families import get_family

    layers = model.get_submodule(get_family(spec.family).layers)
    ckpt = [i for i, layer in enumerate(layers) if "forward" in layer.__dict__]  # checkpoint's wrapper
    n, diff, _ = _verify_pipeline(sch, spec, config, groups, batch, {"grad_accum": 2, "seed": 5})
    return f"ok {n} checks, checkpointed {ckpt}, max diff {diff:.1e}"


def _world() -> dict[str, str]:
    out: dict[str, str] = {}
    tp = build_groups(2, 1, 1)
    for key, (name, knobs) in TP_CASES.items():
        out[key] = _verify_tp(name, knobs, tp)
    for family in CAUSAL:  # the vocab-parallel causal loss, at its own precision
        out[f"tp2-{family}-fp32-loss"] = _verify_tp(f"{family}-tiny", {"tp": 2}, tp, dtype=torch.float32)
    out["broken-opt-heads"] = _verify_tp("opt-tiny", {"tp": 2}, tp, broken="attention_attrs")
    out["broken-bert-norms-sp"] = _verify_tp(
        "bert-tiny", {"tp": 2, "sequence_parallel": True}, tp, broken="norms"
    )
    pp = build_groups(1, 2, 1)
    for key, (name, knobs) in PP_CASES.items():
        out[key] = _verify_pp(name, knobs, pp)
    return out if dist.get_rank() == 0 else {}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str]:
    return spawn(_world, 2, timeout=600)[0]


@pytest.mark.parametrize("case", sorted(TP_CASES))
def test_tensor_parallel_schedule_matches_unscheduled(verdicts: dict[str, str], case: str) -> None:
    assert verdicts[case].startswith("ok"), verdicts[case]


@pytest.mark.parametrize("family", CAUSAL)
def test_vocab_parallel_causal_loss_matches_in_fp32(verdicts: dict[str, str], family: str) -> None:
    assert verdicts[f"tp2-{family}-fp32-loss"].startswith("ok"), verdicts[f"tp2-{family}-fp32-loss"]


def test_a_wrong_description_is_caught(verdicts: dict[str, str]) -> None:
    # OPT views q with num_heads: unshrunk it cannot even reshape; SP without norm grad sums differs.
    assert verdicts["broken-opt-heads"].startswith("failed"), verdicts["broken-opt-heads"]
    assert verdicts["broken-bert-norms-sp"].startswith("failed: VerifyError"), verdicts[
        "broken-bert-norms-sp"
    ]


@pytest.mark.parametrize("case", sorted(PP_CASES))
def test_pipeline_with_checkpointing_matches_unscheduled(verdicts: dict[str, str], case: str) -> None:
    assert verdicts[case].startswith("ok"), verdicts[case]
    assert "checkpointed [0, 1]" in verdicts[case], verdicts[case]


# -- pure parts --------------------------------------------------------------------------------------


def test_chunks_cuts_and_checkpoint_per_stage() -> None:
    assert chunk_bounds(24, 8) == [(3 * i, 3 * i + 3) for i in range(8)]
    assert cut_points(24, 8) == [2, 5, 8, 11, 14, 17, 20]
    assert cut_points(12, 1) == []
    spec = ModelSpec.from_name("bert")
    cfg = ScheduleConfig(pp=4, ckpt_ratio=0.5, ckpt_placement="back")
    assert checkpointed_layers(spec, cfg) == [3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23]
    assert checkpointed_layers(spec, ScheduleConfig(ckpt_ratio=0.25)) == list(range(6))
    # uneven: sizes differ by one, the smaller chunks at the ends (they also run the embedding and the head)
    assert chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert [b - a for a, b in chunk_bounds(70, 12)] == [5] + [6] * 10 + [5]  # BLOOM-176B's 70 layers, pp 12
    assert [b - a for a, b in chunk_bounds(11, 4)] == [2, 3, 3, 3]
    assert cut_points(10, 4) == [1, 4, 7]
    assert checkpointed_layers(spec.with_overrides(layers=10), ScheduleConfig(pp=4, ckpt_ratio=0.5)) == [0, 2, 3, 5, 6, 8]
    # one or two chunks more than layers: the first, then the last, holds none (cut before layer 0)
    assert chunk_bounds(3, 4) == [(0, 0), (0, 1), (1, 2), (2, 3)] and cut_points(3, 4) == [-1, 0, 1]
    assert cut_points(2, 4) == [-1, 0, 1]  # the last chunk (2, 2): the head alone
    with pytest.raises(ScheduleError, match="pipeline chunks must each hold a layer, but the first and the last: "
                                            r"got 3 layers into 6 chunks; use pp \* virtual_stages <= 5"):
        chunk_bounds(3, 6)


def test_rejects_bad_input_before_touching_the_model() -> None:
    spec = ModelSpec.from_name("llama-tiny")  # 4 heads, 2 kv heads
    model = build_model(spec)
    with pytest.raises(ConfigError, match="tp must divide the attention heads"):
        apply_schedule(model, spec, ScheduleConfig(tp=4))
    with pytest.raises(ScheduleError, match=r"group has 1 ranks but config\.tp=2"):
        apply_schedule(model, spec, ScheduleConfig(tp=2))
    with pytest.raises(ScheduleError, match="2 layers but the spec says 4"):
        apply_schedule(model, spec.with_overrides(layers=4), ScheduleConfig())
    with pytest.raises(ScheduleError, match="keeps its layers at"):
        apply_schedule(build_model(ModelSpec.from_name("gpt2-tiny")), spec, ScheduleConfig())


def test_single_rank_schedule_records_the_plan() -> None:
    spec = ModelSpec.from_name("opt-tiny")
    sch = apply_schedule(build_model(spec), spec, ScheduleConfig(fuse_bias_gelu=True, ckpt_ratio=0.5))
    plan = sch.meta["plan"]
    assert plan["checkpointed"] == [0] and plan["pipeline_cuts"] == [] and not plan["vocab_parallel"]
    assert plan["skipped"] == ["fuse_bias_gelu: the opt MLP has no bias + GeLU"]
    assert sch["model.decoder.layers.0"].meta["checkpoint"] is True


def test_rehearsal_tp8_pp8_bert_large_on_64_fake_ranks() -> None:
    """TP 8 x PP 8 through apply_schedule on a meta BERT-large: every shard's shape and the cuts."""
    spec = ModelSpec.from_name("bert")
    config = ScheduleConfig(tp=8, pp=8, ckpt_ratio=1 / 3, sequence_parallel=True)
    init_fake_world(64, rank=21)
    try:
        groups = build_groups(8, 8, 1)
        assert (groups.tp_rank, groups.pp_rank) == (5, 2)
        with torch.device("meta"):
            model = build_model(spec)
        sch = apply_schedule(model, spec, config, groups)
        plan = sch.meta["plan"]
        assert plan["pipeline_cuts"] == [2, 5, 8, 11, 14, 17, 20]
        assert plan["checkpointed"] == [3 * s for s in range(8)]
        expected_local = {
            **{f"attention.self.{x}.weight": (128, 1024) for x in ("query", "key", "value")},
            **{f"attention.self.{x}.bias": (128,) for x in ("query", "key", "value")},
            "attention.output.dense.weight": (1024, 128),
            "intermediate.dense.weight": (512, 1024),
            "intermediate.dense.bias": (512,),
            "output.dense.weight": (1024, 512),
        }
        from autoslapo.primitives.tp import shard_spec

        seen = 0
        for name, p in model.named_parameters():
            s = shard_spec(p)
            if name.startswith("bert.encoder.layer."):
                local = name.split(".", 4)[4]
                if local in expected_local:
                    assert s is not None and tuple(p.shape) == expected_local[local], name
                    seen += 1
                else:  # LayerNorms and row-parallel biases stay whole
                    assert s is None and p.shape == (1024,), name
        assert seen == 24 * len(expected_local)
        emb = model.bert.embeddings.word_embeddings.weight
        assert emb.shape == (3816, 1024) and shard_spec(emb).pad == 6  # 30522 padded to 8 * 3816
        assert model.cls.predictions.decoder.weight is emb
        layer = model.bert.encoder.layer[7].attention.self
        assert layer.num_attention_heads == 2 and layer.all_head_size == 128
    finally:
        dist.destroy_process_group()
