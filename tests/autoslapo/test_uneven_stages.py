"""Pipeline stages over a layer count the chunks do not divide (``autoslapo.layout.chunk_sizes``): the
rule, what the searches propose, and what the cost model charges the busiest rank."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoslapo import layout
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config, estimate
from autoslapo.cost.memory import checkpointed_layer_ids, stage_params
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.plan import checkpointed_layers


@given(st.integers(1, 200), st.integers(1, 64))
def test_chunk_sizes_differ_by_one_with_the_smaller_at_the_ends(layers: int, chunks: int) -> None:
    if chunks > layers + 2:
        return
    sizes = layout.chunk_sizes(layers, chunks)
    assert len(sizes) == chunks and sum(sizes) == layers and max(sizes) - min(sizes) <= 1
    # every chunk holds a layer, but with one or two chunks more than layers the first, then the last
    assert [c for c, n in enumerate(sizes) if n == 0] == [0, chunks - 1][:max(chunks - layers, 0)]
    small = [c for c, n in enumerate(sizes) if n < max(sizes)]
    # outside in: the first, the last, the second, the second last, ...
    ends = sorted(range(chunks), key=lambda c: (min(c, chunks - 1 - c), c != 0))
    assert sorted(small) == sorted(ends[:len(small)])
    bounds = layout.chunk_bounds(layers, chunks)
    assert bounds[0][0] == 0 and bounds[-1][1] == layers
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_rank_layers_and_imbalance() -> None:
    assert [len(r) for r in layout.rank_layers(70, 12)] == [5] + [6] * 10 + [5]
    assert layout.stage_imbalance(70, 12) == pytest.approx(6 * 12 / 70)
    # 24 layers in 16 chunks: every rank of pp 8 gets one short and one long chunk
    assert [len(r) for r in layout.rank_layers(24, 8, 2)] == [3] * 8
    assert layout.stage_imbalance(24, 8, 2) == 1.0
    assert layout.rank_layers(10, 2, 2) == [[0, 1, 5, 6, 7], [2, 3, 4, 8, 9]]


def test_which_families_split_unevenly() -> None:
    bloom_like = ModelSpec.from_name("gpt2-xl").with_overrides(layers=70)
    ScheduleConfig(pp=12, dp=1, grad_accum=12).validate(bloom_like)
    ScheduleConfig(pp=36, grad_accum=72, pipeline_schedule="interleaved", virtual_stages=2).validate(bloom_like)
    with pytest.raises(ConfigError, match=r"pipeline chunks must each hold a layer, but the first and the last \(the "
                                          r"embeddings, the head\): got 70 layers for pp=37 x virtual_stages=2 \(74 "
                                          r"chunks\); use pp x virtual_stages <= 72"):
        ScheduleConfig(pp=37, grad_accum=74, pipeline_schedule="interleaved", virtual_stages=2).validate(bloom_like)
    # a convolutional net's blocks split unevenly too, and an encoder-decoder's one list of both stacks
    ScheduleConfig(pp=3, grad_accum=3).validate(ModelSpec.from_name("wideresnet-tiny"))  # 4 blocks: 1, 2, 1
    ScheduleConfig(pp=5, grad_accum=5).validate(ModelSpec.from_name("t5-small"))  # 6 + 6 blocks: 2, 3, 2, 3, 2
    with pytest.raises(ConfigError, match=r"pipeline chunks must each hold a block: got 6 encoder \+ 6 decoder "
                                          r"blocks for pp=8 x virtual_stages=2 \(16 chunks\); use pp x virtual_stages <= 12"):
        ScheduleConfig(pp=8, grad_accum=16, pipeline_schedule="interleaved", virtual_stages=2).validate(
            ModelSpec.from_name("t5-small"))


def test_searches_propose_only_near_even_splits_but_take_a_pinned_one() -> None:
    bert = ModelSpec.from_name("bert")  # 24 layers
    c64 = ClusterSpec(gpus=64, gpu_type="a100-80gb")
    assert layout.pp_degrees(bert, c64) == [1, 2, 4, 8]  # 16 would leave half the ranks with one layer of two
    assert {p for _, p, _ in layout.layouts(bert, c64, pp=16)} == {16}  # pinned: taken as given
    bloom_like = ModelSpec.from_name("gpt2-xl").with_overrides(layers=70)
    assert 12 in layout.pp_degrees(bloom_like, ClusterSpec(gpus=384, gpu_type="a100-80gb"))
    best = best_config(bert, c64, pp=16, tp=1)
    assert best.config.pp == 16 and best.fits


def test_the_cost_model_charges_the_busiest_rank() -> None:
    cfg = ScheduleConfig(tp=1, pp=12, dp=8, micro_batch=1, grad_accum=24, ckpt_ratio=1.0)
    cluster = ClusterSpec(gpus=96, gpu_type="a100-80gb")
    # 70 layers over 12 stages: ten ranks of 6 and the first and last of 5
    gpt2 = ModelSpec.from_name("gpt2-xl")  # its head (50,257 x 1,600) costs about 2.6 layers
    est = {n: estimate(gpt2.with_overrides(layers=n), cfg, cluster) for n in (60, 70, 72)}
    # the last rank, 5 layers and the head, is the busiest: as with 60 layers
    assert est[70].step_time_s == pytest.approx(est[60].step_time_s) and est[70].step_time_s < est[72].step_time_s
    assert est[70].memory_per_device_bytes <= est[72].memory_per_device_bytes
    llama = ModelSpec.from_name("llama-70b", seq_len=2048)  # a head (32,000 x 8,192) of a third of a layer
    cfg = ScheduleConfig(tp=8, pp=12, dp=1, micro_batch=1, grad_accum=24, ckpt_ratio=1.0)
    cluster = ClusterSpec(gpus=96, gpu_type="a100-80gb")
    est = {n: estimate(llama.with_overrides(layers=n), cfg, cluster) for n in (60, 70, 72)}
    # a 6-layer middle rank is the busiest: slower than 60 layers, faster than 72 (whose last rank adds the head)
    assert est[60].step_time_s < est[70].step_time_s < est[72].step_time_s
    first, last = stage_params(llama.with_overrides(layers=70), cfg)
    first72, last72 = stage_params(llama.with_overrides(layers=72), cfg)
    assert last < last72 and first <= first72


def test_time_and_memory_recompute_the_layers_the_plan_checkpoints() -> None:
    # the ratio and placement apply within each pipeline chunk (autoslapo.plan): the last stage
    # recomputes as many layers with "front" as with "back"
    spec = ModelSpec.from_name("gpt2-xl").with_overrides(layers=10)
    cluster = ClusterSpec(gpus=2, gpu_type="a100-80gb")
    for pp, v in ((2, 1), (2, 2)):
        cfg = ScheduleConfig(pp=pp, grad_accum=4, ckpt_ratio=0.5, pipeline_schedule="interleaved" if v > 1 else "1f1b",
                             virtual_stages=v)
        assert checkpointed_layer_ids(spec, cfg) == checkpointed_layers(spec, cfg)
        front = estimate(spec, cfg, cluster).time.recompute
        back = estimate(spec, replace(cfg, ckpt_placement="back"), cluster).time.recompute
        assert front > 0 and front == pytest.approx(back)


def test_uneven_interleaved_chunks_lengthen_the_bubble() -> None:
    # 40 layers in 16 chunks of 2 and 3: every rank of pp 8 runs 5 layers, but the pipeline fills and
    # drains at the pace of a 3-layer chunk, not 2.5
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    cfg = ScheduleConfig(pp=8, grad_accum=16, pipeline_schedule="interleaved", virtual_stages=2, ckpt_ratio=1.0)
    base = ModelSpec.from_name("gpt2-xl")
    uneven = estimate(base.with_overrides(layers=40), cfg, cluster).time
    even = estimate(base.with_overrides(layers=48), cfg, cluster).time  # 3 layers a chunk, 6 a rank
    assert uneven.bubble / uneven.compute == pytest.approx(1.2 * even.bubble / even.compute, rel=0.05)


def test_the_tuners_space_proposes_a_near_even_split() -> None:
    from search_spaces import space_for

    bloom_like = ModelSpec.from_name("gpt2-xl").with_overrides(layers=70)
    bound = space_for("gpt2").bind(bloom_like, ClusterSpec(gpus=96, gpu_type="a100-80gb"))
    # 70 layers on 96 devices: 1 and 2 divide them; 3, 4, 6, 8, 12 and 24 split them within 10 % (24 x 3
    # layers for 70: 1.03); 16 (5 for 4.375: 1.14), 32 and 48 do not, 96 cannot
    assert set(bound.domains["pp"]) == {1, 2, 3, 4, 6, 8, 12, 24}
    assert any(c.pp == 12 for c in bound.configs())


# -- end chunks without a layer: the embeddings alone, the head alone (Llama 3 405B) -----------------


def test_the_first_and_last_chunk_may_hold_only_the_embeddings_and_the_head() -> None:
    llama3 = ModelSpec.from_name("llama-70b").with_overrides(layers=126)
    assert layout.chunk_sizes(126, 128) == [0] + [1] * 126 + [0]
    assert layout.chunk_sizes(3, 4) == [0, 1, 1, 1]  # one chunk more than layers: the first is empty
    assert [len(r) for r in layout.rank_layers(126, 16, 8)] == [7] + [8] * 14 + [7]
    inter = dict(pipeline_schedule="interleaved", virtual_stages=8)
    ScheduleConfig(pp=16, grad_accum=16, **inter).validate(llama3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"pipeline chunks must each hold a layer, but the first and the last "
                                          r"\(the embeddings, the head\): got 125 layers for pp=16 x virtual_stages=8 "
                                          r"\(128 chunks\); use pp x virtual_stages <= 127"):
        ScheduleConfig(pp=16, grad_accum=16, **inter).validate(llama3.with_overrides(layers=125))  # type: ignore[arg-type]
    # not where the stages run something other than one list of the model's own layers
    for name, blocks in (("albert-tiny", 4), ("wideresnet-tiny", 4), ("t5-tiny", 4)):
        with pytest.raises(ConfigError, match=f"use pp x virtual_stages <= {blocks}$"):
            ScheduleConfig(pp=blocks + 1, grad_accum=blocks + 1).validate(ModelSpec.from_name(name))
    # the plan cuts before layer 0 and after the last, the cost model's checkpointed layers agree
    cfg = ScheduleConfig(pp=2, grad_accum=4, ckpt_ratio=1.0, **dict(inter, virtual_stages=2))  # type: ignore[arg-type]
    two = ModelSpec.from_name("llama-tiny").with_overrides(layers=2)
    assert checkpointed_layers(two, cfg) == checkpointed_layer_ids(two, cfg) == [0, 1]


def test_the_cost_model_estimates_llama3s_126_layers_directly() -> None:
    # 126 layers in 16 x 8 chunks: the middle ranks' 8 layers set the pipeline's slot, as 128 layers'
    # would, while the last rank runs 7 layers and the head instead of 8 and the head
    llama3 = ModelSpec(family="llama", hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248, seq_len=8192,
                       vocab=128256, max_positions=8192)
    cluster = ClusterSpec(gpus=8192, gpu_type="h100-80gb", gpus_per_node=8)
    cfg = ScheduleConfig(tp=8, pp=16, dp=64, micro_batch=1, grad_accum=32, sequence_parallel=True, attn_kernel="flash",
                         pipeline_schedule="interleaved", virtual_stages=8, precision="bf16")
    e126, e128 = estimate(llama3, cfg, cluster), estimate(llama3.with_overrides(layers=128), cfg, cluster)
    # the slot is the same 8 layers; the last rank's head no longer adds to it
    assert 0.9 * e128.step_time_s < e126.step_time_s < e128.step_time_s
    assert e126.memory_per_device_bytes < e128.memory_per_device_bytes
