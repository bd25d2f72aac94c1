"""The WideResNet schedule: what it applies on one rank, what the family refuses (pipeline stages,
the knobs of attention, tokens and vocabularies, declared on the knobs), and that spaces and sweeps
never generate those. Tensor parallelism itself is checked on gloo ranks by ``autoslapo verify``
(tests/autoslapo/test_cli_verify.py) and the loss-equivalence matrix (test_runtime.py)."""

from __future__ import annotations

import pytest
import torch

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOB, KNOBS, ScheduleConfig
from autoslapo.cost.search import candidate_configs
from autoslapo.errors import ConfigError, ScheduleError
from autoslapo.layout import inapplicable_knobs, pp_degrees, tp_degrees
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import ModelSpec
from autoslapo.plan import apply_schedule
from search_spaces import space_for

TINY = ModelSpec.from_name("wideresnet-tiny")
TRANSFORMER_ONLY = {"attn_kernel", "fuse_bias_gelu", "sequence_parallel", "ckpt_granularity", "loss_kernel"}
CONV_ONLY = {"channels_last"}
#: Knobs of some transformer families only (``Knob.families``): the RMSNorm kernel (LLaMA, T5).
FAMILY_ONLY = {"norm_kernel"}


def test_transformer_only_knobs_are_declared_on_the_knobs() -> None:
    assert {k.name for k in KNOBS if k.transformer_only} == TRANSFORMER_ONLY
    assert {k.name for k in KNOBS if k.conv_only} == CONV_ONLY
    assert {k.name for k in KNOBS if k.families} == FAMILY_ONLY
    assert set(inapplicable_knobs(TINY, KNOBS)) == TRANSFORMER_ONLY | FAMILY_ONLY
    assert set(inapplicable_knobs(ModelSpec.from_name("bert-tiny"), KNOBS)) == CONV_ONLY | FAMILY_ONLY
    assert set(inapplicable_knobs(ModelSpec.from_name("llama-tiny"), KNOBS)) == CONV_ONLY


def test_a_transformer_refuses_the_convolutional_knobs() -> None:
    with pytest.raises(ConfigError, match=r"channels_last applies to a convolutional family only .*--channels-last"):
        ScheduleConfig(channels_last=True).validate(ModelSpec.from_name("bert-tiny"))


def test_channels_last_keeps_every_feature_map_nhwc_and_the_function() -> None:
    # the same logits (the same sums in another order); inside, every block's output is NHWC, and
    # with pp 2 the first stage's last block hands its output back in NCHW for the send
    model = build_model(TINY, seed=0)
    batch = example_batch(TINY, 2, seed=1)
    want = model(**batch).logits.detach()
    sch = apply_schedule(model, TINY, ScheduleConfig(channels_last=True, ckpt_ratio=0.5))
    assert sch.meta["plan"]["channels_last"] is True
    assert model.stem.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _a, out: outs.append(out)) for b in model.blocks]
    logits = model(**batch).logits
    assert torch.allclose(logits, want, atol=1e-5)
    assert len(outs) == 4 and all(o.is_contiguous(memory_format=torch.channels_last) for o in outs)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    for h in hooks:
        h.remove()
    cut = build_model(TINY, seed=0)
    plan = apply_schedule(cut, TINY, ScheduleConfig(channels_last=True, pp=2, grad_accum=2))
    first = plan.meta["plan"]["pipeline_cuts"][0]
    out = cut.stem(batch["images"])
    for block in cut.blocks[:first + 1]:
        out = block(out)
    assert out.is_contiguous() and not out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"pp": 5, "grad_accum": 5}, "pipeline chunks must each hold a block: got 4 blocks for pp=5"),
        ({"attn_kernel": "flash"}, "attn_kernel does not apply to wideresnet"),
        ({"tp": 2, "sequence_parallel": True}, "sequence_parallel does not apply"),
        ({"loss_kernel": "chunked"}, "loss_kernel does not apply"),
        ({"fuse_bias_gelu": True}, "fuse_bias_gelu does not apply"),
        ({"ckpt_ratio": 0.5, "ckpt_granularity": "selective"}, "ckpt_granularity does not apply"),
        ({"tp": 32}, "tp must divide the bottleneck width"),
    ],
)
def test_refused_for_the_family(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ScheduleConfig(**knobs).validate(TINY)  # type: ignore[arg-type]


def test_one_rank_schedule_checkpoints_blocks_and_keeps_the_function() -> None:
    model = build_model(TINY, seed=0)
    batch = example_batch(TINY, 2, seed=1)
    want = model(**batch).logits.detach()
    sch = apply_schedule(model, TINY, ScheduleConfig(ckpt_ratio=0.5, ckpt_placement="back"))
    plan = sch.meta["plan"]
    assert plan["family"] == "wideresnet" and plan["checkpointed"] == [2, 3] and plan["sharded"] == []
    assert torch.allclose(model(**batch).logits, want, atol=1e-6)


def test_group_size_must_match_tp() -> None:
    with pytest.raises(ScheduleError, match=r"config\.tp=2"):
        apply_schedule(build_model(TINY), TINY, ScheduleConfig(tp=2))


def test_degrees_and_sweeps_pipeline_by_blocks_and_never_use_transformer_knobs() -> None:
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    # 4 blocks: pp divides them (8 would leave stages empty)
    assert tp_degrees(TINY, cluster) == [1, 2, 4, 8] and pp_degrees(TINY, cluster) == [1, 2, 4]
    configs = [c for group in candidate_configs(TINY, cluster, global_batch=64) for c in group]
    assert configs and {c.pp for c in configs} > {1}
    for c in configs:
        assert all(getattr(c, n) == KNOB[n].default for n in TRANSFORMER_ONLY)
    assert {c.channels_last for c in configs} == {False, True}
    assert {c.channels_last for c in configs} == {False, True}  # a conv family's own knob is swept
    bert = [c for g in candidate_configs(ModelSpec.from_name("bert-tiny"), cluster, global_batch=64) for c in g]
    assert bert and not any(c.channels_last for c in bert)


@pytest.mark.parametrize("space", ["wideresnet", "default"])
def test_search_space_keeps_transformer_knobs_at_defaults(space: str) -> None:
    cluster = ClusterSpec(gpus=4, gpu_type="a100-80gb")
    bound = space_for(space).bind(TINY, cluster, 256)
    configs = bound.configs()
    assert configs and {c.tp for c in configs} == {1, 2, 4}
    if space == "wideresnet":
        assert max(c.micro_batch for c in configs) == 256 and "loss_kernel" not in bound.domains
    assert {c.pp for c in configs} == {1, 2, 4}
    for c in configs:
        assert all(getattr(c, n) == KNOB[n].default for n in TRANSFORMER_ONLY)
    assert {c.channels_last for c in configs} == {False, True}
