"""cut_pipeline_stage misuse, stage building, and PP=2 on real gloo ranks against the unpipelined model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.models.adapters import PathAdapter
from autoslapo.pipeline import build_stage_modules
from autoslapo.primitives.pipeline import layer_cuts, pipeline_cuts, stage_bounds
from autoslapo.schedule import Schedule, create_schedule


def _ce(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _seq() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)])


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        tie_word_embeddings=False,
    )
    return BertForMaskedLM(cfg)


def _gpt2(tied: bool = True) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=512,
        n_embd=64,
        n_layer=4,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tied,
    )
    return GPT2LMHeadModel(cfg)


# family -> (builder, layer-list prefix, batch maker, loss fn, reference forward)
FAMILIES: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "seq": (_seq, ""),
    "bert": (_bert, "bert.encoder.layer."),
    "gpt2": (_gpt2, "transformer.h."),
}


def _batch(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if family == "seq":
        return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    return torch.randint(0, 512, (8, 16), generator=g), torch.randint(0, 512, (8, 16), generator=g)


def _loss_fn(family: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return nn.functional.mse_loss if family == "seq" else _ce


def _forward(family: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) if family == "seq" else model(input_ids=x).logits


# -- cuts and stages (one process) ------------------------------------------------------------------


def test_cut_records_in_layer_order() -> None:
    sch = create_schedule(_bert())
    sch["bert.encoder.layer.2"].cut_pipeline_stage()
    sch["bert.encoder.layer.0"].cut_pipeline_stage()
    assert pipeline_cuts(sch) == ["bert.encoder.layer.0", "bert.encoder.layer.2"]
    assert sch["bert.encoder.layer.2"].meta["pipeline_cut"] is True


def test_cut_misuse_errors() -> None:
    sch = create_schedule(_bert())
    with pytest.raises(ScheduleError, match="got the root"):
        sch.cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="child of BertEncoder"):
        sch["bert.encoder.layer"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="child of BertLayer"):
        sch["bert.encoder.layer.0.attention"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match=r"before the first layer only .* child 2 of 'bert.encoder.layer'; cut "
                                            r"after 'bert.encoder.layer.1' instead"):
        sch["bert.encoder.layer.2"].cut_pipeline_stage(before=True)
    sch["bert.encoder.layer.1"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="already a pipeline cut"):
        sch["bert.encoder.layer.1"].cut_pipeline_stage()
    seq = create_schedule(nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2)))
    seq["0"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="one layer list"):
        seq["0.0"].cut_pipeline_stage()


def test_stage_bounds() -> None:
    assert stage_bounds(4, [1]) == [(0, 2), (2, 4)]
    assert stage_bounds(4, [0, 1, 2]) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ScheduleError, match="increasing"):
        stage_bounds(4, [2, 1])
    # before the first layer and after the last: end stages of the embeddings and of the head alone
    assert stage_bounds(2, [-1, 0, 1]) == [(0, 0), (0, 1), (1, 2), (2, 2)]
    with pytest.raises(ScheduleError, match="do not fit 4 layers"):
        stage_bounds(4, [-2, 1])


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_end_stages_without_layers_chain_to_the_model(family: str) -> None:
    # Llama 3 405B's layout: the first stage embeds, the last runs the head, the layers in between
    model, x, ref, sch, prefix = _family_schedule(family)
    sch[f"{prefix}0"].cut_pipeline_stage(before=True)
    sch[f"{prefix}1"].cut_pipeline_stage()
    sch[f"{prefix}3"].cut_pipeline_stage()  # the last layer
    with pytest.raises(ScheduleError, match="already cut before"):
        sch[f"{prefix}0"].cut_pipeline_stage(before=True)
    assert layer_cuts(sch).cuts == (-1, 1, 3)  # type: ignore[union-attr]
    stages, _ = build_stage_modules(sch)
    assert [s.bounds for s in stages] == [(0, 0), (0, 2), (2, 4), (4, 4)]
    assert not list(stages[0].layers) and not list(stages[-1].layers)
    _assert_chain_is_the_model(stages, model, x, ref)


def _family_schedule(family: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, Schedule, str]:
    """A family's small model, an input, the model's output for it, its schedule and its layers' prefix."""
    build, prefix = FAMILIES[family]
    model = build()
    x, _ = _batch(family)
    return model, x, _forward(family, model, x), create_schedule(model), prefix


def _assert_chain_is_the_model(stages: list[Any], model: nn.Module, x: torch.Tensor, ref: torch.Tensor) -> None:
    """The stages run one after another give the model's output and own its parameters, all of them."""
    h: Any = x
    for s in stages:
        h = s(h)
    torch.testing.assert_close(h, ref)
    owned = {id(p) for s in stages for p in s.parameters()}
    assert owned == {id(p) for p in model.parameters()}  # the same parameter objects, all of them


@pytest.mark.parametrize("family", ["seq", "bert", "gpt2"])
def test_stages_chained_equal_model(family: str) -> None:
    model, x, ref, sch, prefix = _family_schedule(family)
    for i in (0, 2):
        sch[f"{prefix}{i}"].cut_pipeline_stage()
    stages, _ = build_stage_modules(sch)
    assert [s.bounds for s in stages] == [(0, 1), (1, 3), (3, 4)]
    _assert_chain_is_the_model(stages, model, x, ref)


def test_build_stage_errors() -> None:
    sch = create_schedule(_seq())
    with pytest.raises(ScheduleError, match="needs pipeline cuts"):
        build_stage_modules(sch)
    sch["1"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="adapter's layer list"):
        build_stage_modules(sch, PathAdapter(layers_path="layers"))
    wrapped = create_schedule(nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])))
    wrapped["0.0"].cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="no pipeline adapter"):
        build_stage_modules(wrapped)


# -- PP=2 on gloo ranks -----------------------------------------------------------------------------


def _pp_worker(cases: list[tuple[str, str, int]], tied: bool) -> list[dict[str, Any]]:
    """On each rank: pipeline every case and compare loss and this rank's gradients to the reference."""
    import torch.distributed as dist

    from autoslapo.pipeline import build_pipeline

    results = []
    for family, schedule, virtual in cases:
        build, prefix = FAMILIES[family]
        model = _gpt2(tied) if family == "gpt2" else build()
        ref = copy.deepcopy(model)
        x, y = _batch(family)
        loss_fn = _loss_fn(family)
        ref_loss = loss_fn(_forward(family, ref, x), y)
        ref_loss.backward()
        sch = create_schedule(model)
        for c in [1] if virtual == 1 else [0, 1, 2]:
            sch[f"{prefix}{c}"].cut_pipeline_stage()
        rt = build_pipeline(
            sch,
            pp_group=dist.group.WORLD,
            grad_accum=4,
            schedule=schedule,
            virtual_stages=virtual,
            loss_fn=loss_fn,
        )
        loss = rt.step(x, target=y)
        names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        ref_params = dict(ref.named_parameters(remove_duplicate=False))
        worst = 0.0
        for p in rt.parameters():
            r = ref_params[names[id(p)]].grad
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            worst = max(worst, (g - r).abs().max().item() if r is not None else g.abs().max().item())
        results.append(
            {
                "case": (family, schedule, virtual),
                "loss": None if loss is None else loss.item(),
                "ref_loss": ref_loss.item(),
                "grad_diff": worst,
                "n_params": len(rt.parameters()),
                "total": len(ref_params),
            }
        )
        # the same cuts with the other stage layout: the stage count no longer fits
        wrong = {"schedule": "gpipe"} if virtual > 1 else {"schedule": "interleaved", "virtual_stages": 2}
        with pytest.raises(ScheduleError, match=r"pp_size \* virtual_stages"):
            build_pipeline(sch, pp_group=dist.group.WORLD, grad_accum=4, loss_fn=loss_fn, **wrong)
    return results


def _check(per_rank: list[list[dict[str, Any]]]) -> None:
    for r0, r1 in zip(*per_rank, strict=True):
        assert r0["case"] == r1["case"]
        assert r0["loss"] is None and r1["loss"] == pytest.approx(r1["ref_loss"], rel=1e-5), r1
        assert max(r0["grad_diff"], r1["grad_diff"]) < 1e-5, (r0, r1)
        assert r0["n_params"] + r1["n_params"] >= r0["total"] - 1  # every parameter lives on a rank


def test_pp2_matches_unpipelined() -> None:
    from autoslapo.dist import spawn

    # GPipe and 1F1B on a transformers model each and on nn.Sequential; interleaved and the other
    # family x schedule pairs run in the slow test (test_build also pipelines a meta-built GPT-2)
    cases = [
        ("seq", "1f1b", 1),
        ("bert", "1f1b", 1),
        ("gpt2", "gpipe", 1),
    ]
    _check(spawn(_pp_worker, 2, cases, True, timeout=180))


@pytest.mark.slow
def test_pp2_all_schedules_all_families() -> None:
    from autoslapo.dist import spawn

    cases = [
        (f, s, 2 if s == "interleaved" else 1) for f in FAMILIES for s in ("gpipe", "1f1b", "interleaved")
    ]
    _check(spawn(_pp_worker, 2, cases, True, timeout=400))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_base_models_use_the_family_adapter(family: str) -> None:
    # The family descriptions name the LM classes' paths; a base model (BertModel, GPT2Model) runs
    # with the same adapter, its paths without the base prefix and without a head.
    from tests.conftest import tiny_bert, tiny_gpt2

    model = (tiny_bert() if family == "bert" else tiny_gpt2()).eval()
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    sch = create_schedule(model)
    layers = "encoder.layer" if family == "bert" else "h"
    sch[f"{layers}.0"].cut_pipeline_stage()
    stages, adapter = build_stage_modules(sch)
    assert adapter.layers_path == layers and "cls" not in adapter.last_paths and "lm_head" not in adapter.last_paths
    h: Any = x
    with torch.no_grad():
        for s in stages:
            h = s(h)
        torch.testing.assert_close(h, model(input_ids=x).last_hidden_state)


# -- a shared layer's calls as the layer list (ALBERT) -----------------------------------------------

ALBERT_LAYER = "albert.encoder.albert_layer_groups.0.albert_layers.0"


def test_call_cuts_record_and_misuse_errors() -> None:
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec
    from autoslapo.primitives.pipeline import layer_cuts

    sch = create_schedule(build_model(ModelSpec.from_name("albert-tiny")))
    node = sch[ALBERT_LAYER]
    node.cut_pipeline_stage(call=2, calls=4)
    node.cut_pipeline_stage(call=0, calls=4)
    cuts = layer_cuts(sch)
    assert cuts is not None and cuts.shared and cuts.cuts == (0, 2) and cuts.layers == (ALBERT_LAYER,) * 4
    assert cuts.parent == ALBERT_LAYER.rsplit(".", 1)[0] and node.meta["pipeline_cut"] is True
    with pytest.raises(ScheduleError, match=r"call 2 of .* is already a pipeline cut"):
        node.cut_pipeline_stage(call=2, calls=4)
    with pytest.raises(ScheduleError, match=r"after call 3 of 4 leaves an empty stage"):
        node.cut_pipeline_stage(call=3, calls=4)
    with pytest.raises(ScheduleError, match="one module and call count"):
        node.cut_pipeline_stage(call=1, calls=6)
    with pytest.raises(ScheduleError, match="needs both call and calls"):
        node.cut_pipeline_stage(call=1)
    with pytest.raises(ScheduleError, match="already cut over calls"):
        node.cut_pipeline_stage()
    with pytest.raises(ScheduleError, match="only child of a ModuleList"):
        create_schedule(_bert())["bert.encoder.layer.1"].cut_pipeline_stage(call=0, calls=2)
    bert = create_schedule(_bert())
    bert["bert.encoder.layer.1"].cut_pipeline_stage()
    plain = layer_cuts(bert)
    assert plain is not None and plain.cuts == (1,) and not plain.shared and len(plain.layers) == 4
    with pytest.raises(ScheduleError, match="only child"):
        bert["bert.encoder.layer.2"].cut_pipeline_stage(call=0, calls=2)


def test_albert_stages_run_the_shared_layer_calls_like_the_model() -> None:
    # ALBERT under pp=2 with a checkpointed call: the stages, run in a pipeline's order (both
    # microbatches through stage 0, then stage 1; a no-grad shape-inference pass of stage 0 first,
    # as PipelineStage makes), give the model's loss and gradients and recompute exactly that call.
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec
    from autoslapo.plan import apply_schedule
    from autoslapo.runtime.train import loss_function, step_batch

    spec = ModelSpec.from_name("albert-tiny", seq_len=16)
    model = build_model(spec, dropout=0.0)
    ref = copy.deepcopy(model)
    config = ScheduleConfig(pp=2, grad_accum=2, ckpt_ratio=0.5, ckpt_placement="back")
    sch = apply_schedule(model, spec, config)
    assert sch.meta["plan"]["checkpointed"] == [1, 3] and sch.meta["plan"]["pipeline_cuts"] == [1]
    # one call of four (the plan's [1, 3] looks the same from any count that is off by a stage)
    sch[ALBERT_LAYER].checkpoint(calls=[1], period=spec.layers)
    stages, _ = build_stage_modules(sch)
    assert [s.bounds for s in stages] == [(0, 2), (2, 4)] and all(s.shared for s in stages)
    layer = model.get_submodule(ALBERT_LAYER)
    assert all(m is layer for s in stages for m in s.layers)
    assert {id(p) for s in stages for p in s.parameters()} == {id(p) for p in model.parameters()}

    batch = step_batch(spec, 4, 0, 0)
    halves = [{k: v[i * 2:(i + 1) * 2] for k, v in batch.items()} for i in range(2)]
    inputs: list[torch.Tensor] = []  # each call's input; a recomputation repeats one of them
    layer.attention.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach().clone()))
    with torch.no_grad():
        stages[0](halves[0]["input_ids"])
    inputs.clear()
    loss_fn = loss_function(spec)
    hidden = [stages[0](mb["input_ids"]) for mb in halves]
    losses = [loss_fn(stages[1](h), mb["labels"]) for h, mb in zip(hidden, halves, strict=True)]
    forward = list(inputs)
    assert len(forward) == 2 * spec.layers
    sum(losses).backward()
    recomputed = [next(i for i, x in enumerate(forward) if torch.equal(x, r)) for r in inputs[len(forward):]]
    # forward order: mb0 calls 0-1, mb1 calls 0-1, mb0 calls 2-3, mb1 calls 2-3
    call_of = [0, 1, 0, 1, 2, 3, 2, 3]
    assert sorted(call_of[i] for i in recomputed) == [1, 1]

    ref_losses = [ref(**mb).loss for mb in halves]
    sum(ref_losses).backward()
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses).detach())
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def _pipelined(spec: Any, schedule: str, virtual: int) -> tuple[nn.Module, nn.Module, Any, Any, float | None, float]:
    """On each of 2 ranks: ``spec``'s model over pp 2 x ``virtual`` chunks (half its layers checkpointed) and
    one step of 2 micro-batches, beside the unpipelined model's. Returns (model, the unpipelined
    reference, the schedule, the pipeline, the pipeline's loss or None on this rank, the reference loss)."""
    import torch.distributed as dist

    from autoslapo.config import ScheduleConfig
    from autoslapo.models.build import build_model
    from autoslapo.pipeline import build_pipeline
    from autoslapo.plan import apply_schedule
    from autoslapo.runtime.train import loss_function, step_batch

    model = build_model(spec, dropout=0.0)
    ref = copy.deepcopy(model)
    config = ScheduleConfig(pp=2, grad_accum=2, pipeline_schedule=schedule, virtual_stages=virtual, ckpt_ratio=0.5)
    sch = apply_schedule(model, spec, config)
    batch = step_batch(spec, 4, 0, 0)
    loss_fn = loss_function(spec)
    ref_loss = 0.0
    for i in range(2):
        part = loss_fn(ref(input_ids=batch["input_ids"][i * 2:i * 2 + 2]).logits, batch["labels"][i * 2:i * 2 + 2]) / 2
        part.backward()
        ref_loss += part.item()
    rt = build_pipeline(sch, pp_group=dist.group.WORLD, grad_accum=2, schedule=schedule, virtual_stages=virtual,
                        loss_fn=loss_fn)
    loss = rt.step(batch["input_ids"], target=batch["labels"])
    return model, ref, sch, rt, None if loss is None else loss.item(), ref_loss


def _worst_grad_diff(model: nn.Module, ref: nn.Module, rt: Any) -> float:
    """The largest gradient difference of the pipeline's parameters from the reference's."""
    names = {id(p): n for n, p in model.named_parameters()}
    refs = dict(ref.named_parameters())
    return max((p.grad - refs[names[id(p)]].grad).abs().max().item() for p in rt.parameters())


def _albert_pp_worker(schedule: str, virtual: int) -> float:
    """On each of 2 ranks: ALBERT's calls over pp x virtual stages; the worst gradient difference."""
    from autoslapo.models.spec import ModelSpec

    model, ref, _, rt, _, _ = _pipelined(ModelSpec.from_name("albert-tiny", seq_len=16), schedule, virtual)
    names = {id(p): n for n, p in model.named_parameters()}
    # every rank holds the shared layer; its gradient is the sum over all stages' calls
    assert any("albert_layers.0" in names[id(p)] for p in rt.parameters())
    return _worst_grad_diff(model, ref, rt)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved", 2)])
def test_albert_pp2_gradients_equal_the_model(schedule: str, virtual: int) -> None:
    # interleaved: each rank holds two stages with the one layer; torch would scale its gradient twice
    from autoslapo.dist import spawn

    assert max(spawn(_albert_pp_worker, 2, schedule, virtual, timeout=180)) < 1e-6


# -- uneven stages: a layer count the chunks do not divide -------------------------------------------


def _uneven_pp_worker(schedule: str, virtual: int, layers: int = 5) -> tuple[list[list[int]], float, float]:
    """On each of 2 ranks: a LLaMA of ``layers`` layers over pp x virtual chunks of unequal size; the
    chunks, the loss difference and the worst gradient difference against the unpipelined model."""
    from autoslapo.models.spec import ModelSpec

    spec = ModelSpec.from_name("llama-tiny", seq_len=16).with_overrides(layers=layers)
    model, ref, sch, rt, loss, ref_loss = _pipelined(spec, schedule, virtual)
    loss_diff = abs(loss - ref_loss) if loss is not None else 0.0
    return sch.meta["plan"]["stages"], loss_diff, _worst_grad_diff(model, ref, rt)


@pytest.mark.parametrize(("schedule", "virtual", "layers", "stages"), [
    ("1f1b", 1, 5, [[0, 2], [2, 5]]),
    ("interleaved", 2, 5, [[0, 1], [1, 2], [2, 4], [4, 5]]),
    # 2 layers in 4 chunks: the first holds the embeddings alone, the last the head alone (Llama 3)
    ("interleaved", 2, 2, [[0, 0], [0, 1], [1, 2], [2, 2]]),
])
def test_uneven_stages_give_the_models_loss_and_gradients(schedule: str, virtual: int, layers: int,
                                                          stages: list) -> None:
    # sizes differ by one, the smaller chunks at the pipeline's ends
    from autoslapo.dist import spawn

    for got, loss_diff, grad_diff in spawn(_uneven_pp_worker, 2, schedule, virtual, layers, timeout=180):
        assert got == stages
        assert loss_diff < 1e-5 and grad_diff < 1e-5, (loss_diff, grad_diff)


# -- a convolutional net's blocks (WideResNet): feature maps between stages ------------------------


def test_wideresnet_stages_chained_equal_model() -> None:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec
    from autoslapo.plan import apply_schedule
    from autoslapo.runtime.train import loss_function, step_batch

    spec = ModelSpec.from_name("wideresnet-tiny")
    model = build_model(spec)
    ref = copy.deepcopy(model)
    # the checkpoint ratio applies within each chunk, as for a transformer's layers
    halves = apply_schedule(build_model(spec), spec, ScheduleConfig(pp=2, grad_accum=2, ckpt_ratio=0.5)).meta["plan"]
    assert halves["pipeline_cuts"] == [1] and halves["checkpointed"] == [0, 2]
    # (no checkpointing here: a recomputed BatchNorm would update its running statistics twice)
    sch = apply_schedule(model, spec, ScheduleConfig(pp=4, grad_accum=4))
    assert sch.meta["plan"]["pipeline_cuts"] == [0, 1, 2] and sch.meta["plan"]["stages"] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    stages, adapter = build_stage_modules(sch)
    assert adapter.input_keys == ("images",) and [s.bounds for s in stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert set(stages[0].parts) == {"stem"} and set(stages[-1].parts) == {"fc"}
    batch = step_batch(spec, 4, 0, 0)
    h = batch["images"]
    shapes = []
    for s in stages:
        h = s(h)
        shapes.append(tuple(h.shape))
    # one feature map per cut, its channels and side those of the group the cut block ends
    assert shapes == [(4, 32, 16, 16), (4, 64, 8, 8), (4, 128, 4, 4), (4, spec.vocab)]
    loss = loss_function(spec)(h, batch["labels"])
    want = ref(**batch)
    torch.testing.assert_close(h, want.logits)
    loss.backward()
    want.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    for (name, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)  # BatchNorm's running statistics, each in its stage


def _wrn_pp_worker() -> tuple[float, float]:
    """On each of 2 ranks: WideResNet over 2 stages (1F1B, 2 micro-batches) against the model run in
    the same 2 micro-batches; the worst gradient and BatchNorm running-statistic differences."""
    import torch.distributed as dist

    from autoslapo.config import ScheduleConfig
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec
    from autoslapo.pipeline import build_pipeline
    from autoslapo.plan import apply_schedule
    from autoslapo.runtime.train import loss_function, step_batch

    spec = ModelSpec.from_name("wideresnet-tiny")
    model = build_model(spec)
    ref = copy.deepcopy(model)
    sch = apply_schedule(model, spec, ScheduleConfig(pp=2, grad_accum=2))
    batch = step_batch(spec, 4, 0, 0)
    for i in range(2):
        (ref(**{k: v[i * 2:i * 2 + 2] for k, v in batch.items()}).loss / 2).backward()
    rt = build_pipeline(sch, pp_group=dist.group.WORLD, grad_accum=2, loss_fn=loss_function(spec))
    assert rt.input_keys == ("images",)
    rt.step(batch["images"], target=batch["labels"])
    names = {id(p): n for n, p in model.named_parameters()}
    refs = dict(ref.named_parameters())
    grad = max((p.grad - refs[names[id(p)]].grad).abs().max().item() for p in rt.parameters())
    ref_buffers = dict(ref.named_buffers())
    mine = {f"blocks.{i}" for i in range(*rt.modules[0].bounds)}
    stats = max((b - ref_buffers[n]).abs().max().item() for n, b in model.named_buffers()
                if ".".join(n.split(".")[:2]) in mine)
    return grad, stats


def test_wideresnet_pp2_gradients_and_batchnorm_statistics_equal_the_model() -> None:
    from autoslapo.dist import spawn

    for grad, stats in spawn(_wrn_pp_worker, 2, timeout=180):
        assert grad < 1e-5 and stats < 1e-6, (grad, stats)
