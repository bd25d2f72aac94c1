"""ALBERT (one shared layer, factorized embedding) and GPT-Neo (global and local attention): shapes,
rules, the shared layer's per-call checkpointing, GPT-Neo's SDPA kernel, and the cost model's
parameter, FLOP and activation terms against what the built models hold, compute and save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.flops import model_flops_per_sample
from autoslapo.cost.memory import estimate_activation_bytes, stage_params
from autoslapo.errors import ConfigError, ScheduleError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import ModelSpec
from autoslapo.plan import apply_schedule
from search_spaces import space_for
from tests.autoslapo.saved import saved_activation_bytes

NEW = ("albert-tiny", "gpt-neo-tiny")


# -- shapes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "published"), [
    ("gpt-neo-125m", 125_198_592),
    ("gpt-neo-1.3b", 1_315_575_808),  # EleutherAI/gpt-neo-1.3B
    ("gpt-neo-2.7b", 2_651_307_520),  # EleutherAI/gpt-neo-2.7B
    ("albert-base", 11_221_680),  # albert-base-v2 as AlbertForMaskedLM (no pooler, no SOP head)
    ("albert-xxlarge", 206_368_944),  # albert-xxlarge-v2 likewise (223M with pooler + SOP head)
])
def test_published_sizes_count_what_the_model_holds(name: str, published: int) -> None:
    spec = ModelSpec.from_name(name)
    with torch.device("meta"):
        model = build_model(spec, attn_kernel="eager")
    assert sum(p.numel() for p in model.parameters()) == spec.num_params() == published


def test_albert_shares_one_layer_and_factorizes_its_embedding() -> None:
    spec = ModelSpec.from_name("albert-xxlarge")
    assert (spec.hidden, spec.layers, spec.heads, spec.ffn, spec.embedding_size, spec.vocab) == (
        4096, 12, 64, 16384, 128, 30000)
    assert spec.shared_layers and spec.stored_layers == 1
    assert spec.num_params() < 2 * spec.layer_params()  # twelve layers, stored once
    model = build_model(ModelSpec.from_name("albert-tiny"))
    assert len(model.albert.encoder.albert_layer_groups) == 1
    assert model.albert.embeddings.word_embeddings.weight.shape == (1024, 32)


def test_gpt_neo_alternates_global_and_local_layers() -> None:
    spec = ModelSpec.from_name("gpt-neo-1.3b")
    assert spec.layer_attention_types()[:4] == ["global", "local", "global", "local"]
    assert spec.extra["window_size"] == 256 and spec.local_attention
    tiny = ModelSpec.from_name("gpt_neo-tiny")  # the family's name spelling finds the preset too
    model = build_model(tiny)
    assert model.config.attention_layers == ["global", "local"] and model.config.window_size == 32 < tiny.seq_len
    assert model.transformer.h[0].attn.attention.q_proj.bias is None


@pytest.mark.parametrize(("family", "extra", "match"), [
    ("albert", {}, r"needs extra\['embedding_size'\] as int"),
    ("gpt_neo", {"window_size": 8, "attention_pattern": ["global", "sparse"]}, "attention_pattern must be"),
    ("gpt_neo", {"window_size": 0, "attention_pattern": ["local"]}, "window_size must be a positive"),
])
def test_family_shape_keys_are_checked(family: str, extra: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelSpec(family=family, hidden=64, layers=2, heads=4, ffn=256, seq_len=16, vocab=128, extra=extra)


# -- rules ----------------------------------------------------------------------------------------


def test_albert_takes_a_pipeline_and_refuses_sequence_parallelism() -> None:
    spec = ModelSpec.from_name("albert-tiny")
    ScheduleConfig(pp=2, grad_accum=2).validate(spec)  # stages run calls of the shared layer
    ScheduleConfig(pp=3, grad_accum=3).validate(spec)  # calls 1, 2, 1: the shorter stages at the ends
    with pytest.raises(ConfigError, match="pipeline chunks must each hold a layer: got 4 layers for pp=5"):
        ScheduleConfig(pp=5, grad_accum=5).validate(spec)
    with pytest.raises(ConfigError, match="sequence_parallel cannot split albert"):
        ScheduleConfig(tp=2, sequence_parallel=True).validate(spec)


def test_spaces_never_propose_what_a_family_refuses() -> None:
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    albert = ModelSpec.from_name("albert-xxlarge")
    configs = space_for("albert").bind(albert, cluster).configs()
    assert configs and {c.pp for c in configs} > {1} and {c.tp for c in configs} > {1}
    assert not {c.sequence_parallel for c in configs} - {False}
    neo = ModelSpec.from_name("gpt-neo-1.3b")
    bound = space_for("gpt_neo").bind(neo, cluster)
    assert "flash" not in bound.domains["attn_kernel"] and max(bound.domains["pp"]) > 1
    with pytest.raises(ConfigError, match="flash cannot apply gpt_neo's local"):
        ScheduleConfig(attn_kernel="flash").validate(neo)


# -- schedule pieces on one rank ------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "placement", "calls"), [
    (0.5, "front", [0, 1]), (0.25, "back", [3]), (0.5, "spread", [0, 2]), (1.0, "front", [0, 1, 2, 3])])
def test_albert_checkpoints_the_chosen_calls_of_its_shared_layer(ratio: float, placement: str,
                                                                 calls: list[int]) -> None:
    spec = ModelSpec.from_name("albert-tiny")
    model = build_model(spec, dropout=0.0)
    ref = build_model(spec, dropout=0.0)
    sch = apply_schedule(model, spec, ScheduleConfig(ckpt_ratio=ratio, ckpt_placement=placement))
    assert sch.meta["plan"]["checkpointed"] == calls
    layer = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    seen: list[bool] = []  # per attention call: was grad mode on (recomputed calls run in backward)
    layer.attention.register_forward_hook(lambda *_: seen.append(torch.is_grad_enabled()))
    batch = example_batch(spec, 2, 16)
    for _ in range(2):  # the call count restarts every forward
        seen.clear()
        model(**batch).loss.backward()
        assert len(seen) == spec.layers + len(calls)
    ref(**batch).loss.backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, 2 * q.grad, msg=n)


def test_checkpoint_calls_must_fit_the_period() -> None:
    from autoslapo.schedule import create_schedule

    sch = create_schedule(build_model(ModelSpec.from_name("albert-tiny")))
    with pytest.raises(ScheduleError, match=r"checkpoint calls must lie in 0\.\.period-1"):
        sch["albert.encoder.albert_layer_groups.0.albert_layers.0"].checkpoint(calls=[4], period=4)


def test_gpt_neo_sdpa_equals_its_eager_local_attention() -> None:
    spec = ModelSpec.from_name("gpt-neo-tiny")
    batch = example_batch(spec, 2)  # 128 tokens: the local layer's window of 32 matters
    out = {}
    for kernel in ("eager", "sdpa"):
        model = build_model(spec, attn_kernel=kernel, dropout=0.0)
        res = model(**batch)
        res.loss.backward()
        out[kernel] = (res.logits, model.transformer.h[1].attn.attention.q_proj.weight.grad)
    torch.testing.assert_close(out["sdpa"], out["eager"], rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="flash cannot apply"):
        build_model(spec, attn_kernel="flash")


def test_gpt_neo_kernel_switches_on_the_built_model() -> None:
    spec = ModelSpec.from_name("gpt-neo-tiny")
    model = build_model(spec, attn_kernel="eager", dropout=0.0)
    ids = example_batch(spec, 1, 64)["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits
        sch = apply_schedule(model, spec, ScheduleConfig(attn_kernel="sdpa"))
        assert "_attn" in model.transformer.h[1].attn.attention.__dict__
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
        sch.attention_kernel("eager")
        assert "_attn" not in model.transformer.h[1].attn.attention.__dict__


# -- the cost model against the models ------------------------------------------------------------


def _saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct tensors autograd saves for backward (weights and buffers left out)."""
    saved, loss = saved_activation_bytes(model, batch)
    assert loss is not None
    loss.backward()
    return saved


@pytest.mark.parametrize("name", NEW)
def test_flops_and_parameters_match_the_built_model(name: str) -> None:
    spec = ModelSpec.from_name(name)
    model = build_model(spec, attn_kernel="eager", dropout=0.0)
    batch = example_batch(spec, 2, seed=1)
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    # every layer call (ALBERT: the shared layer four times) and the full attention products
    assert counter.get_total_flops() == pytest.approx(2 * model_flops_per_sample(spec), rel=1e-9)
    held = sum(p.numel() for p in model.parameters())
    state = stage_params(spec, ScheduleConfig(precision="fp32"))[0]
    assert state == pytest.approx(held, rel=0.025)  # the shared layer counted once; the MLM head's transform aside


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_activation_terms_match_what_autograd_saves(name: str, kernel: str) -> None:
    spec = ModelSpec.from_name(name)
    batch = example_batch(spec, 4, seed=1)
    got, want = {}, {}
    for ratio in (0.0, 0.5):
        config = ScheduleConfig(precision="fp32", attn_kernel=kernel, micro_batch=4, ckpt_ratio=ratio)
        model = build_model(spec, attn_kernel=kernel, dropout=0.0)
        apply_schedule(model, spec, config)
        got[ratio] = _saved_bytes(model, batch)
        want[ratio] = estimate_activation_bytes(spec, config, dropout=False, runtime="autoslapo")
        assert got[ratio] == pytest.approx(want[ratio], rel=0.15), ratio
    # what checkpointing half the layer calls saves (ALBERT: calls of the one shared layer)
    assert got[0.0] - got[0.5] == pytest.approx(want[0.0] - want[0.5], rel=0.1)


@pytest.mark.parametrize(("name", "params"), [
    ("gpt-neo-1.3b", 1_315_575_808), ("gpt-neo-2.7b", 2_651_307_520), ("albert-xxlarge", 206_368_944)])
def test_estimate_of_a_published_size_reports_its_parameters(
        name: str, params: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["estimate", name, "--gpus", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_params"] == params and d["fits"] and d["samples_per_s"] > 0
    if name.startswith("albert"):
        assert d["config"]["pp"] == 1
    else:
        assert d["config"]["attn_kernel"] != "flash"


def test_albert_pipeline_stages_each_hold_the_shared_layer_and_sum_its_gradients() -> None:
    from autoslapo.cost import device_perf
    from autoslapo.cost.time import estimate_time

    spec = ModelSpec.from_name("albert-xxlarge")
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    layer = spec.layer_params()
    one = ScheduleConfig(dp=8, micro_batch=4, grad_accum=8)
    staged = {pp: ScheduleConfig(pp=pp, dp=8 // pp, micro_batch=4, grad_accum=8) for pp in (2, 4)}
    first, last = stage_params(spec, staged[2])
    # the whole shared layer on every stage: the weights a device holds do not fall with pp
    assert first >= layer and last >= layer and stage_params(spec, staged[4]) == (first, last)
    assert max(stage_params(spec, one)) >= first
    perf = device_perf(cluster)
    t1, t2 = estimate_time(spec, one, cluster, perf), estimate_time(spec, staged[2], cluster, perf)
    assert t1.pp_comm == 0 and t2.bubble > 0 and t2.compute < t1.compute
    # at NVLink's 300 GB/s at best: the hidden states of 8 micro-batches (and the bubble's slot) sent
    # and their gradients received, plus the layer's bf16 gradients (~400 MB) all-reduced over the
    # 2 stages once a step
    p2p = (8 + 1) * 2 * 4 * spec.seq_len * spec.hidden * 2 / 300e9
    assert t2.pp_comm > p2p + layer * 2 / 300e9
