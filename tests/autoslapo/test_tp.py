"""Tensor and sequence parallelism on real gloo ranks: outputs and gradients equal the unsharded model.

The ``apply_tp_*`` functions are the hand-written schedules these tests check (the knob-driven
family schedule is built elsewhere on the same primitives). Each spawned world runs many checks and
returns their verdicts, because starting ranks costs seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoslapo import Verify, create_schedule
from autoslapo.dist import build_groups, spawn
from autoslapo.errors import ScheduleError, VerifyError
from autoslapo.models.build import build_model
from autoslapo.models.spec import ModelSpec
from autoslapo.schedule import Schedule
from tests.conftest import bert_config, tiny_bert, tiny_gpt2, tiny_mlp, token_ids

# -- schedules under test ---------------------------------------------------------------------------


def apply_column(sch: Schedule, *, conv1d: bool = False, chunks: int = 1, grad_sync: bool = True) -> None:
    """Column-parallel Linear (weight [out, in]) or Conv1D (weight [in, out])."""
    sch.shard("weight", 1 if conv1d else 0, chunks=chunks)
    sch.shard("bias", 0, chunks=chunks)
    if conv1d:
        sch.shrink_attr("nf")
    if grad_sync:
        sch.sync("bwd_post", "all_reduce")


def apply_row(sch: Schedule, *, conv1d: bool = False, op: str = "all_reduce", dim: int = -1) -> None:
    """Row-parallel Linear/Conv1D: shard the input dim, sum the outputs (bias counted once)."""
    sch.shard("weight", 0 if conv1d else 1)
    sch.sync("fwd_post", op, dim=dim)


def apply_tp_mlp(sch: Schedule, *, row_sync: bool = True, col_grad_sync: bool = True) -> None:
    apply_column(sch["1"], grad_sync=col_grad_sync)
    if row_sync:
        apply_row(sch["3"])
    else:
        sch["3"].shard("weight", 1)


def apply_tp_bert(sch: Schedule, *, vocab: bool = True, sp: bool = False, ckpt: bool = False) -> None:
    if vocab:
        sch["embeddings.word_embeddings"].vocab_parallel()
    if sp:
        sch["embeddings"].sync("fwd_post", "split", dim=1)
    row_op, dim = ("reduce_scatter", 1) if sp else ("all_reduce", -1)
    for i in range(len(sch["encoder.layer"].children)):
        layer = sch[f"encoder.layer.{i}"]
        attn = layer["attention.self"]
        for name in ("query", "key", "value"):
            apply_column(attn[name], grad_sync=False)
        attn.shrink_attr("num_attention_heads", "all_head_size")
        if sp:
            attn.sync("fwd_pre", "all_gather", dim=1, bwd="reduce_scatter")
            layer["intermediate.dense"].sync("fwd_pre", "all_gather", dim=1, bwd="reduce_scatter")
        else:
            attn.sync("bwd_post", "all_reduce")  # one all-reduce for the q, k, v input gradients
        apply_column(layer["intermediate.dense"], grad_sync=not sp)
        apply_row(layer["attention.output.dense"], op=row_op, dim=dim)
        apply_row(layer["output.dense"], op=row_op, dim=dim)
        if sp:
            layer["attention.output.LayerNorm"].allreduce_grads()
            layer["output.LayerNorm"].allreduce_grads()
        if ckpt:
            layer.checkpoint()
    if sp:
        sch["encoder"].sync("fwd_post", "all_gather", dim=1)


def apply_tp_gpt2(sch: Schedule, *, vocab: bool = True, prefix: str = "") -> None:
    if vocab:
        sch[f"{prefix}wte"].vocab_parallel()
    for i in range(len(sch[f"{prefix}h"].children)):
        block = sch[f"{prefix}h.{i}"]
        apply_column(block["attn.c_attn"], conv1d=True, chunks=3)  # fused q|k|v, sharded block by block
        block["attn"].shrink_attr("split_size", "num_heads", "embed_dim")
        apply_row(block["attn.c_proj"], conv1d=True)
        apply_column(block["mlp.c_fc"], conv1d=True)
        apply_row(block["mlp.c_proj"], conv1d=True)


# -- helpers ----------------------------------------------------------------------------------------


def _check(results: dict[str, str], name: str, body: Callable[[], Any], expect: str | None = None) -> None:
    """Run one check; record "ok", or the error. ``expect``: a VerifyError containing it is "ok".

    ``results["_only"]`` (if present) names the checks to run; the others are skipped silently.
    """
    only = results.get("_only")
    if only and name not in only.split(","):
        return
    try:
        body()
        results[name] = "ok" if expect is None else f"expected VerifyError mentioning {expect!r}, got none"
    except VerifyError as exc:
        results[name] = "ok" if expect is not None and expect in str(exc) else f"VerifyError: {exc}"


def _verify(model: torch.nn.Module, inputs: Any, schedule: Callable[[Schedule], None], group: Any,
            **kw: Any) -> Schedule:
    sch = create_schedule(model, group=group)
    with Verify(sch, inputs, **kw):
        schedule(sch)
    return sch


def _tp_world(tp: int, only: tuple[str, ...] = ()) -> dict[str, str]:
    """Run every check (or those named in ``only``) on this rank; return name -> verdict."""
    groups = build_groups(tp=tp)
    group = groups.tp_group
    r: dict[str, str] = {"_only": ",".join(only)}
    coords = (groups.tp_rank, groups.dp_rank, groups.pp_rank)
    r["coords"] = "ok" if coords == (dist.get_rank(), 0, 0) else f"bad coords {groups}"
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    ids = token_ids()

    _check(r, "mlp", lambda: _verify(tiny_mlp(), (x,), apply_tp_mlp, group))
    _check(r, "mlp_row_without_allreduce",
           lambda: _verify(tiny_mlp(), (x,), lambda s: apply_tp_mlp(s, row_sync=False), group), expect="output")
    _check(r, "mlp_column_without_grad_allreduce",
           lambda: _verify(tiny_mlp(), (x,), lambda s: apply_tp_mlp(s, col_grad_sync=False), group),
           expect="gradient of parameter 0.weight")

    def bert() -> None:
        sch = _verify(tiny_bert(), (ids,), apply_tp_bert, group)
        q = sch["encoder.layer.0.attention.self.query"].mod
        emb = sch["embeddings.word_embeddings"].mod
        if tuple(q.weight.shape) != (64 // tp, 64) or tuple(emb.weight.shape) != (512 // tp, 64):
            raise VerifyError(f"bad shard shapes {tuple(q.weight.shape)} {tuple(emb.weight.shape)}")

    _check(r, "bert_tp_vocab", bert)
    _check(r, "bert_sp", lambda: _verify(tiny_bert(), (ids,), lambda s: apply_tp_bert(s, sp=True), group))

    def gpt2() -> None:
        sch = _verify(tiny_gpt2(), (ids,), apply_tp_gpt2, group)
        shape = tuple(sch["h.0.attn.c_attn"].mod.weight.shape)
        if shape != (64, 3 * 64 // tp):
            raise VerifyError(f"bad c_attn shard shape {shape}")

    _check(r, "gpt2_tp_fused_qkv", gpt2)

    def gpt2_tied() -> None:
        model = tiny_gpt2(lm_head=True)

        def schedule(s: Schedule) -> None:
            apply_tp_gpt2(s, prefix="transformer.")
            # tied to wte, so lm_head is column-parallel over the vocabulary: gather the logits,
            # and sum the partial gradients of its input
            s["lm_head"].sync("fwd_post", "all_gather", dim=-1)
            s["lm_head"].sync("bwd_post", "all_reduce")

        sch = _verify(model, (ids,), schedule, group)
        if sch["lm_head"].mod.weight is not sch["transformer.wte"].mod.weight:
            raise VerifyError("wte/lm_head tie was broken by shard")

    _check(r, "gpt2_lm_head_tied", gpt2_tied)

    def bert_mlm_padded_vocab() -> None:
        # 511 rows divide by neither 2 nor 4: the table is padded, the tied head drops the padded logits
        from transformers import BertForMaskedLM

        torch.manual_seed(0)
        model = BertForMaskedLM(bert_config(vocab_size=511))

        def schedule(s: Schedule) -> None:
            apply_tp_bert(s["bert"])
            s["cls.predictions.decoder"].vocab_parallel_head()

        sch = _verify(model, (ids % 511,), schedule, group)
        emb = sch["bert.embeddings.word_embeddings"].mod.weight
        if tuple(emb.shape) != (-(-511 // tp), 64) or emb is not sch["cls.predictions.decoder"].mod.weight:
            raise VerifyError(f"bad padded vocab shard {tuple(emb.shape)} or broken tie")

    _check(r, "bert_mlm_padded_vocab", bert_mlm_padded_vocab)
    # Dropout on replicated activations only (after row-parallel all-reduces): every rank and the
    # reference draw the same masks, so train mode can be verified; checkpoint must replay them.
    _check(r, "bert_tp_ckpt_dropout",
           lambda: _verify(tiny_bert(dropout=0.1, attn_dropout=0.0), (ids,),
                           lambda s: apply_tp_bert(s, ckpt=True), group, dropout=True))
    del r["_only"]
    return r


# With 4 ranks on 2 cores every check costs about twice as much, so the default run checks one
# representative of each kind at tp=4 (TP MLP and a wrong schedule, BERT with a vocab-parallel
# embedding, GPT-2's fused q|k|v); tp=2 and the slow run check all of them.
TP4_DEFAULT = ("mlp", "mlp_row_without_allreduce", "bert_tp_vocab", "gpt2_tp_fused_qkv")


def _assert_all_ok(results: list[dict[str, str]], want: int) -> None:
    for rank, res in enumerate(results):
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {rank}: {bad}"
        assert len(res) >= want, f"rank {rank} ran only {sorted(res)}"


def test_tp2_world() -> None:
    _assert_all_ok(spawn(_tp_world, 2, 2, timeout=240), want=10)


@pytest.mark.slow
def test_tp4_world_representatives() -> None:
    _assert_all_ok(spawn(_tp_world, 4, 4, TP4_DEFAULT, timeout=240), want=len(TP4_DEFAULT))


@pytest.mark.slow
def test_tp4_world_all_checks() -> None:
    _assert_all_ok(spawn(_tp_world, 4, 4, timeout=400), want=10)


# -- tp = 1 (no process group): the same schedules are no-ops on the values ------------------------------


def test_tp1_schedules_and_checkpoint_with_dropout() -> None:
    ids = token_ids()
    x = torch.randn(4, 16)
    _verify(tiny_mlp(), (x,), apply_tp_mlp, None)
    sch = _verify(tiny_bert(dropout=0.1), (ids,), lambda s: apply_tp_bert(s, ckpt=True), None)
    assert sch["encoder.layer.0"].meta["checkpoint"] is True
    _verify(tiny_gpt2(dropout=0.1), (ids,), apply_tp_gpt2, None)


def test_checkpoint_dropout_is_rng_safe() -> None:
    ids = token_ids()

    def ckpt(preserve: bool) -> Callable[[Schedule], None]:
        def schedule(s: Schedule) -> None:
            for i in range(2):
                s[f"encoder.layer.{i}"].checkpoint(preserve_rng_state=preserve)

        return schedule

    v = _verify(tiny_bert(dropout=0.2), (ids,), ckpt(True), None)
    with pytest.raises(VerifyError, match="gradient of parameter"):
        _verify(tiny_bert(dropout=0.2), (ids,), ckpt(False), None)
    # checkpoint off again restores the plain forward
    v["encoder.layer.0"].checkpoint(False)
    assert "forward" not in vars(v["encoder.layer.0"].mod)


def test_fork_rng_replays_under_checkpoint() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8))
    sch = create_schedule(model)
    sch["1"].fork_rng(per_rank=True)
    x = torch.randn(4, 8)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(3)
        model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]

    plain = grads()
    sch.checkpoint()
    assert all(torch.equal(a, b) for a, b in zip(plain, grads(), strict=True))
    # the caller's RNG stream advances by exactly one draw for the fork
    torch.manual_seed(5)
    model(x)
    after = torch.rand(1)
    torch.manual_seed(5)
    torch.randint(0, 2**62, (1,))
    assert torch.equal(after, torch.rand(1))


def _fork_world() -> list[list[float]]:
    rank = dist.get_rank()
    out = []
    for per_rank in (True, False):
        model = torch.nn.Dropout(0.5)
        create_schedule(model, group=dist.group.WORLD).fork_rng(per_rank=per_rank)
        torch.manual_seed(11)
        out.append(model(torch.ones(64)).tolist())
    del rank
    return out


def test_fork_rng_per_rank_and_shared_masks() -> None:
    r0, r1 = spawn(_fork_world, 2, timeout=120)
    assert r0[0] != r1[0], "per_rank=True must draw different masks on different TP ranks"
    assert r0[1] == r1[1], "per_rank=False must draw the same mask on every TP rank"


# -- misuse -----------------------------------------------------------------------------------------


def test_misuse_errors() -> None:
    sch = create_schedule(tiny_mlp())
    with pytest.raises(ScheduleError, match=r"no parameter 'wieght'.*weight, bias"):
        sch["1"].shard("wieght", 0)
    with pytest.raises(ScheduleError, match=r"axis must be in \[-2, 2\).*axis=2"):
        sch["1"].shard("weight", 2)
    with pytest.raises(ScheduleError, match="not divisible by chunks=3"):
        sch["1"].shard("weight", 0, chunks=3)
    with pytest.raises(ScheduleError, match="no sharded parameters"):
        sch["3"].sync("fwd_post", "all_reduce")
    with pytest.raises(ScheduleError, match="mode must be one of"):
        sch["1"].sync("forward", "all_reduce")
    with pytest.raises(ScheduleError, match="only all_reduce"):
        sch["1"].sync("bwd_post", "all_gather")
    sch["1"].shard("weight", 0)
    with pytest.raises(ScheduleError, match="already sharded"):
        sch["1"].shard("weight", 0)
    with pytest.raises(ScheduleError, match=r"did you mean '1'|children here"):
        sch["7"]
    with pytest.raises(ScheduleError, match="shrink_attr needs an int"):
        sch["1"].shrink_attr("weight")
    with pytest.raises(ScheduleError, match=r"shrink_attr needs in_features % tp == 0.*in_features=16, tp=3"):
        sch["1"].shrink_attr("in_features", by=3)


def test_vocab_parallel_on_tables_tied_to_one_already_sharded() -> None:
    # T5's encoder and decoder embeddings share one table: the second call keeps the shard
    model = build_model(ModelSpec.from_name("t5-tiny"))
    sch = create_schedule(model)
    first = sch["encoder.embed_tokens"].vocab_parallel()
    assert sch["decoder.embed_tokens"].vocab_parallel() == first
    assert model.decoder.embed_tokens.weight is model.encoder.embed_tokens.weight is model.lm_head.weight
    with pytest.raises(ScheduleError, match="already vocab-parallel"):
        sch["decoder.embed_tokens"].vocab_parallel()
