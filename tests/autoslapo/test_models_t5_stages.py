"""T5 as pipeline stages (``autoslapo.models.t5_stages``): one layer list over both stacks, cuts within
and between them; stages chained in one process give the unpipelined model's loss and gradients;
joined layer lists misused; the cost model's pipelined T5 (per-stage memory, bubble, p2p of the pair)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.cost.encdec import busiest_rank, checkpointed_blocks, stage_blocks
from autoslapo.cost.memory import estimate_activation_bytes, stage_params
from autoslapo.errors import ScheduleError
from autoslapo.models.build import build_model
from autoslapo.models.spec import ModelSpec
from autoslapo.models.t5_stages import T5StageAdapter
from autoslapo.pipeline import build_stage_modules, find_tied
from autoslapo.plan import apply_schedule
from autoslapo.primitives.pipeline import layer_position, pipeline_cuts
from autoslapo.schedule import create_schedule

TINY = ModelSpec.from_name("t5-tiny").with_overrides(seq_len=16)
LISTS = ["encoder.block", "decoder.block"]
BLOCKS = ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"]
TABLE = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, TINY.vocab, (4, 16), generator=g), torch.randint(0, TINY.vocab, (4, 16), generator=g)


@pytest.mark.parametrize(("cuts", "bounds"), [
    ([1], [(0, 2), (2, 4)]),  # between the stacks
    ([0, 1, 2], [(0, 1), (1, 2), (2, 3), (3, 4)]),  # within each stack and between them
    ([2], [(0, 3), (3, 4)]),  # a stage with blocks of both stacks
])
def test_stages_chained_give_the_models_loss_and_gradients(cuts: list[int], bounds: list[tuple[int, int]]) -> None:
    model = build_model(TINY, dropout=0.0, seed=0)
    ref = copy.deepcopy(model)
    x, y = _batch()
    want = ref(input_ids=x, labels=y).loss
    want.backward()
    sch = create_schedule(model)
    sch.join_layer_lists(LISTS)
    for c in reversed(cuts):
        sch[BLOCKS[c]].cut_pipeline_stage()
    assert pipeline_cuts(sch) == [BLOCKS[c] for c in cuts]
    stages, adapter = build_stage_modules(sch)
    assert isinstance(adapter, T5StageAdapter) and adapter.input_keys == ("input_ids", "labels")
    assert [s.bounds for s in stages] == bounds
    h: Any = (x, y)
    for s in stages:
        h = s(*h) if isinstance(h, tuple) else s(h)
    loss = torch.nn.functional.cross_entropy(h.flatten(0, 1), y.flatten())
    torch.testing.assert_close(loss, want)
    loss.backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[name].grad, msg=name)
    assert {id(p) for s in stages for p in s.parameters()} == {id(p) for p in model.parameters()}
    # each stack's relative-position table is owned by every stage holding blocks of that stack
    # (find_tied sums its gradients when those stages sit on different ranks)
    tied = {id(t.param) for r in range(len(stages)) for t in find_tied(stages, len(stages), r)}
    for stack, holders in (("encoder", sum(a < 2 for a, _ in bounds)), ("decoder", sum(b > 2 for _, b in bounds))):
        assert (id(model.get_parameter(f"{stack}.{TABLE}")) in tied) == (holders > 1), stack


def test_joined_layer_lists_are_checked() -> None:
    sch = create_schedule(build_model(TINY, dropout=0.0))
    with pytest.raises(ScheduleError, match="primitive of the root"):
        sch["encoder"].join_layer_lists(LISTS)
    with pytest.raises(ScheduleError, match="two or more"):
        sch.join_layer_lists(["encoder.block"])
    with pytest.raises(ScheduleError, match=r"ModuleLists or nn\.Sequentials"):
        sch.join_layer_lists(["encoder.block", "decoder.final_layer_norm"])
    # without joining, the encoder's list is the pipeline's: its stages cannot be built
    alone = create_schedule(build_model(TINY, dropout=0.0))
    alone["encoder.block.1"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match=r"join_layer_lists first"):
        build_stage_modules(alone)
    sch.join_layer_lists(LISTS)
    sch["decoder.block.0"].cut_pipeline_stage()
    sch["encoder.block.1"].cut_pipeline_stage()
    assert [layer_position(sch, p) for p in pipeline_cuts(sch)] == [1, 2]
    with pytest.raises(ScheduleError, match="after the last block of joined layer lists leaves a stage without blocks"):
        sch["decoder.block.1"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="before the first block of joined layer lists"):
        sch["encoder.block.0"].cut_pipeline_stage(before=True)
    with pytest.raises(ScheduleError, match="joined layer lists"):
        sch["encoder.block.0.layer.0"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="before the cuts"):
        sch.join_layer_lists(LISTS)


def test_apply_schedule_cuts_the_joined_list_evenly() -> None:
    half = ScheduleConfig(pp=2, grad_accum=2, ckpt_ratio=0.5, ckpt_placement="front")
    sch = apply_schedule(build_model(TINY, dropout=0.0), TINY, half)
    assert pipeline_cuts(sch) == ["encoder.block.1"]  # between the stacks
    assert sch.meta["plan"]["checkpointed"] == [0, 2]  # the ratio within each stage
    inter = ScheduleConfig(pp=2, grad_accum=2, pipeline_schedule="interleaved", virtual_stages=2)
    sch = apply_schedule(build_model(TINY, dropout=0.0), TINY, inter)
    assert pipeline_cuts(sch) == BLOCKS[:3]
    stages, _ = build_stage_modules(sch)
    assert [s.bounds for s in stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]


# -- the cost model ---------------------------------------------------------------------------------

LARGE = ModelSpec.from_name("t5-large")  # 24 + 24 blocks, source 512 and target 128 tokens
CLUSTER = ClusterSpec(gpus=64, gpu_type="a100-80gb")


def test_stage_blocks_follow_the_chunks() -> None:
    assert stage_blocks(TINY, ScheduleConfig(pp=2, grad_accum=2), 0) == [0, 1]  # the encoder
    assert stage_blocks(TINY, ScheduleConfig(pp=2, grad_accum=2), 1) == [2, 3]  # the decoder
    inter = ScheduleConfig(pp=2, grad_accum=2, pipeline_schedule="interleaved", virtual_stages=2)
    assert stage_blocks(TINY, inter, 0) == [0, 2] and stage_blocks(TINY, inter, 1) == [1, 3]
    assert stage_blocks(TINY, ScheduleConfig(), 0) == [0, 1, 2, 3]


def test_uneven_t5_stages_agree_between_plan_and_cost_model() -> None:
    # 2 + 2 blocks over 3 stages: 1, 2, 1, the middle stage holding the last encoder and the first decoder block
    config = ScheduleConfig(pp=3, grad_accum=3, ckpt_ratio=0.5, ckpt_placement="front")
    assert [stage_blocks(TINY, config, r) for r in range(3)] == [[0], [1, 2], [3]]
    assert busiest_rank(TINY, config) == 1
    sch = apply_schedule(build_model(TINY, dropout=0.0), TINY, config)
    assert pipeline_cuts(sch) == ["encoder.block.0", "decoder.block.0"]
    assert sch.meta["plan"]["checkpointed"] == sorted(checkpointed_blocks(TINY, config))
    # t5-large's 48 blocks over 5 ranks: 9, 10, 10, 10, 9; a middle rank sets the pipeline's slot
    five = ScheduleConfig(tp=8, pp=5, dp=1, micro_batch=4, grad_accum=10, zero_stage=1)
    assert [len(stage_blocks(LARGE, five, r)) for r in range(5)] == [9, 10, 10, 10, 9]
    wider = ClusterSpec(gpus=40, gpu_type="a100-80gb")
    e5 = estimate(LARGE, five, wider)
    assert e5.fits and e5.time.bubble > 0
    # the busiest rank's blocks set the step: 48 blocks over 5 cost about what 50 do, more than 45
    def step(blocks: int) -> float:
        spec = dataclasses.replace(LARGE.with_overrides(layers=blocks // 2),
                                   extra={**LARGE.extra, "decoder_layers": blocks - blocks // 2})
        return estimate(spec, five, wider).step_time_s
    assert step(45) < step(48) <= step(50) * 1.02


def test_pipelined_t5_holds_less_per_stage_and_pays_a_bubble_and_p2p() -> None:
    def cfg(pp: int, **kw: Any) -> ScheduleConfig:
        return ScheduleConfig(tp=8, pp=pp, dp=8 // pp, micro_batch=4, grad_accum=8, zero_stage=1, **kw)

    flat, piped = cfg(1), cfg(4)
    assert max(stage_params(LARGE, piped)) < max(stage_params(LARGE, flat)) / 3
    first, last = stage_params(LARGE, piped)
    assert last > first  # the decoder's blocks are larger (cross-attention) and the head sits last
    t1, t4 = estimate(LARGE, flat, CLUSTER).time, estimate(LARGE, piped, CLUSTER).time
    assert t1.bubble == 0 == t1.pp_comm and t4.bubble > 0 and t4.pp_comm > 0
    assert t4.compute < t1.compute / 3  # each device runs a quarter of the blocks
    # GPipe keeps every micro-batch's activations on the first stage, 1F1B at most pp of them
    gpipe = estimate_activation_bytes(LARGE, cfg(4, pipeline_schedule="gpipe"))
    assert gpipe > 1.5 * estimate_activation_bytes(LARGE, piped)
    # the pair of streams (source + target tokens) crosses each boundary, not the source alone
    longer = dataclasses.replace(LARGE, extra={**LARGE.extra, "decoder_seq_len": 512})
    assert estimate(longer, piped, CLUSTER).time.pp_comm > t4.pp_comm


def test_zero3_gathers_and_hooks_count_both_stacks_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # ZeRO-3 runs its hooks on every block a rank holds, the decoder's too: with the hooks made to
    # dominate the step, the per-block cost is charged for t5-large's 24 + 24 blocks, not its 24 encoder ones
    from autoslapo.cost import time as cost_time

    monkeypatch.setattr(cost_time, "ZERO3_HOOK_S", 1.0)
    config = ScheduleConfig(dp=16, micro_batch=1, grad_accum=1, zero_stage=3)
    per_block = cost_time._submodules(LARGE) * 4 * 1.0
    dp_comm = estimate(LARGE, config, ClusterSpec(gpus=16, gpu_type="a100-80gb")).time.dp_comm
    assert LARGE.blocks == 48 and dp_comm / per_block == pytest.approx(48, rel=0.02)
