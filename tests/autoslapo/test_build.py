"""build: meta-device models materialize shard by shard with the unscheduled model's weights; and a
64-rank layout rehearsed on a fake process group in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoslapo import build, create_schedule
from autoslapo.build import materialize, path_seed
from autoslapo.config import ScheduleConfig
from autoslapo.dist import build_groups, init_fake_world, spawn
from autoslapo.errors import ScheduleError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.resolve import resolve_model
from autoslapo.models.spec import ModelSpec
from autoslapo.models.user import user_loss
from autoslapo.plan import apply_schedule
from autoslapo.primitives.tp import gather_shards, shard_spec
from tests.autoslapo.test_tp import apply_tp_bert, apply_tp_gpt2
from tests.conftest import bert_config, tiny_gpt2, token_ids

MY_MODEL = Path(__file__).resolve().parents[2] / "experiments" / "my_model.py"


def _meta_bert(**kw: Any) -> Any:
    from transformers import BertModel

    with torch.device("meta"):
        return BertModel(bert_config(**kw))


def _build_world() -> list[str]:
    group = dist.group.WORLD
    bad = []
    full = build(create_schedule(_meta_bert()), seed=7)
    sch = create_schedule(_meta_bert(), group=group)
    apply_tp_bert(sch)
    model = build(sch, seed=7)
    want = dict(full.named_parameters())
    for name, p in model.named_parameters():
        spec = shard_spec(p)
        got = gather_shards(p, spec) if spec is not None else p.detach()
        if spec is not None and tuple(p.shape) == spec.full_shape:
            bad.append(f"{name} not sliced")
        if not torch.equal(got, want[name]):
            bad.append(name)
    for name, b in full.named_buffers():
        if not torch.equal(b, dict(model.named_buffers())[name]):
            bad.append(f"buffer {name}")
    return bad


def _meta_gpt2_lm(layers: int = 4) -> Any:
    from transformers import GPT2LMHeadModel

    cfg = tiny_gpt2(lm_head=True).config
    cfg.n_layer = layers
    with torch.device("meta"):
        return GPT2LMHeadModel(cfg)


def _pp_build_world() -> list[str]:
    """PP=2: each rank materializes exactly its stage (plus the tied embedding) with the full model's values."""
    import torch.nn.functional as F

    bad = []
    rank = dist.get_rank()
    full = build(create_schedule(_meta_gpt2_lm()), seed=3)
    want = dict(full.named_parameters(remove_duplicate=False))
    model = _meta_gpt2_lm()
    sch = create_schedule(model)
    sch["transformer.h.1"].cut_pipeline_stage()

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    rt = build(sch, seed=3, pp_group=dist.group.WORLD, grad_accum=2, loss_fn=loss_fn)
    stage = {id(p) for m in rt.modules for p in m.parameters()}
    real = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.is_meta}
    mine = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in stage}
    if real != mine:
        bad.append(f"materialized {sorted(real ^ mine)} differ from the stage's parameters")
    expect_layers = {f"transformer.h.{i}." for i in ((0, 1) if rank == 0 else (2, 3))}
    layers = {n[: len("transformer.h.0.")] for n in real if n.startswith("transformer.h.")}
    if layers != expect_layers:
        bad.append(f"stage layers {sorted(layers)} != {sorted(expect_layers)}")
    for n in real:
        if not torch.equal(dict(model.named_parameters(remove_duplicate=False))[n], want[n]):
            bad.append(f"value of {n}")
    if rank == 1 and "lm_head.weight" not in real:
        bad.append("the last stage lacks the tied lm_head weight")
    if any(not b.is_meta for b in model.transformer.wpe.buffers()) and rank == 1:
        bad.append("rank 1 materialized the first stage's buffers")
    ids = token_ids(batch=4)
    loss = rt.step(ids, target=ids)
    ref = loss_fn(full(ids).logits, ids)
    if rank == 1 and (loss is None or not torch.allclose(loss, ref, rtol=1e-5)):
        bad.append(f"pipelined loss {loss} != reference {ref.item()}")
    return bad


def _build_worlds() -> list[str]:
    # one spawned world for both checks: starting ranks costs more than either check
    return _build_world() + _pp_build_world()


def test_meta_build_matches_unscheduled_weights_tp2_and_pp2() -> None:
    for rank, bad in enumerate(spawn(_build_worlds, 2, timeout=180)):
        assert not bad, f"rank {rank}: {bad}"


@pytest.mark.parametrize("family", ["bert", "gpt2", "gpt_neo", "user"])
def test_a_meta_model_with_fused_bias_gelu_starts_from_the_unscheduled_weights(
        family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fusion moves the Linear (GPT-2's Conv1D under the new region; an nn.Linear into FusedLinearGelu):
    # its weights are still drawn with the seed of the path it had, so the first loss is the unscheduled
    # model's (the meta-built training path gave GPT-2 -1.1e-2, BERT -6.1e-3 before)
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    spec = resolve_model(str(MY_MODEL)) if family == "user" else ModelSpec.from_name(f"{family}-tiny", seq_len=32)
    config = ScheduleConfig(fuse_bias_gelu=True, ckpt_ratio=0.5, precision="fp32")
    with torch.device("meta"):
        model, ref = build_model(spec, seed=0, dropout=0.0), build_model(spec, seed=0, dropout=0.0)
    sch = apply_schedule(model, spec, config, compiler="eager")
    assert sch.meta["plan"]["fused_bias_gelu"]
    materialize(model, seed=5)
    materialize(ref, seed=5)
    batch = example_batch(spec, 2, seed=1)
    assert torch.equal(user_loss(model(**batch)), user_loss(ref(**batch)))


def test_build_is_deterministic_and_keeps_ties() -> None:
    a = build(create_schedule(_meta_bert()), seed=1)
    b = build(create_schedule(_meta_bert()), seed=1)
    c = build(create_schedule(_meta_bert()), seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.embeddings.word_embeddings.weight, c.embeddings.word_embeddings.weight)
    assert torch.equal(a.embeddings.position_ids[0, :4], torch.arange(4))
    assert path_seed(0, "a") != path_seed(0, "b")
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        g = GPT2LMHeadModel(tiny_gpt2(lm_head=True).config)
    g = build(create_schedule(g))
    assert g.lm_head.weight is g.transformer.wte.weight
    real = tiny_gpt2()
    assert build(create_schedule(real)) is real
    with pytest.raises(ScheduleError, match="only a pipelined schedule takes"):
        build(create_schedule(real), grad_accum=4)


BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                  max_position_embeddings=512)


def test_rehearsal_64_ranks_tp8_pp8_bert_large() -> None:
    """TP 8 x PP 8 on 64 fake ranks, meta device: every TP shard's shape, and each stage's layers."""
    from transformers import BertModel

    from autoslapo.pipeline import local_stage_modules

    init_fake_world(64, rank=13)
    try:
        groups = build_groups(tp=8, pp=8, dp=1)
        assert (groups.tp_rank, groups.dp_rank, groups.pp_rank) == (5, 0, 1)
        with torch.device("meta"):
            model = BertModel(bert_config(vocab_size=30522, **BERT_LARGE))
        sch = create_schedule(model, group=groups.tp_group)
        assert sch.group_size == 8 and sch.rank == 5
        apply_tp_bert(sch, sp=True)
        # 30522 rows pad to 30528 = 8 * 3816 (Megatron's rule); gathering drops the 6 padded rows
        assert sch["embeddings.word_embeddings"].meta["vocab_parallel"] == {
            "start": 5 * 3816, "size": 3816, "vocab": 30522, "pad": 6}
        expected = {
            "query.weight": (128, 1024), "query.bias": (128,), "value.weight": (128, 1024),
            "attention.output.dense.weight": (1024, 128), "intermediate.dense.weight": (512, 1024),
            "intermediate.dense.bias": (512,), "layer.23.output.dense.weight": (1024, 512),
            "word_embeddings.weight": (3816, 1024),
        }
        seen = 0
        for name, p in model.named_parameters():
            spec = shard_spec(p)
            if spec is None:
                continue
            seen += 1
            assert spec.rank == 5 and spec.group_size == 8
            full = list(spec.full_shape)
            full[spec.axis] = (full[spec.axis] + spec.pad) // 8
            assert tuple(p.shape) == tuple(full), name
            for suffix, shape in expected.items():
                if name.endswith(suffix) and (suffix.startswith("layer.") or "layer.23" not in name):
                    assert tuple(p.shape) == shape, name
        assert seen == 24 * 10 + 1  # q, k, v (w, b), attn-out w, intermediate (w, b), out w; + vocab
        assert sch["encoder.layer.0.attention.self"].mod.num_attention_heads == 2

        # PP part: 8 stages of 3 layers; stage s on pipeline rank s (one stage per rank)
        for i in range(2, 23, 3):
            sch[f"encoder.layer.{i}"].cut_pipeline_stage()
        for pp_rank in (0, 1, 7):
            (stage,) = local_stage_modules(sch, groups.pp_group, pp_rank=pp_rank)
            assert stage.bounds == (3 * pp_rank, 3 * pp_rank + 3)
            assert list(stage.layers) == [model.encoder.layer[i] for i in range(*stage.bounds)]
            assert (stage.first, stage.last) == (pp_rank == 0, pp_rank == 7)
            assert set(stage.parts) == ({"embeddings"} if pp_rank == 0 else set())
            params = dict(stage.named_parameters())
            assert len(params) == 3 * 16 + (5 if pp_rank == 0 else 0)  # 16 per layer; embeddings' 5
            assert all(p.is_meta for p in params.values())
            assert params["layers.0.attention.self.query.weight"].shape == (128, 1024)
            assert params["layers.2.output.dense.weight"].shape == (1024, 512)
            if pp_rank == 0:
                assert params["owned.embeddings.word_embeddings.weight"].shape == (3816, 1024)
        unpadded = create_schedule(_meta_bert(vocab_size=30522), group=groups.tp_group)
        with pytest.raises(ScheduleError, match=r"size 30522 on axis 0.*tp=8.*pick a tp that divides 30522"):
            unpadded["embeddings.word_embeddings"].vocab_parallel(pad=False)
    finally:
        dist.destroy_process_group()


def test_gpt2_meta_rehearsal_fake_tp4() -> None:
    from transformers import GPT2Model

    init_fake_world(4, rank=3)
    try:
        with torch.device("meta"):
            model = GPT2Model(tiny_gpt2().config)
        sch = create_schedule(model, group=dist.group.WORLD)
        apply_tp_gpt2(sch)
        assert tuple(model.h[0].attn.c_attn.weight.shape) == (64, 48)
        assert model.h[0].attn.c_attn.nf == 48 and model.h[0].attn.split_size == 16
    finally:
        dist.destroy_process_group()


def test_build_keeps_gradient_hooks_of_materialized_parameters() -> None:
    """A primitive's gradient hook (sequence parallelism's norm-gradient sum) is on the Parameter
    object; ``build`` replaces meta parameters, so it must register the hook on the new one."""
    from autoslapo.primitives.tp import add_grad_hook

    sch = create_schedule(_meta_bert())
    norm = sch["encoder.layer.0.output.LayerNorm"].mod
    add_grad_hook(norm.weight, lambda g: g * 3)
    model = build(sch, seed=0)
    w = model.encoder.layer[0].output.LayerNorm.weight
    assert not w.is_meta
    w.grad = None
    (w * 2).sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 6.0))
