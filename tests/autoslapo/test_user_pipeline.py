"""Pipeline stages of a user's own module (``autoslapo.user_pipeline``): in one process, stages built
from separate copies of the model (one a pipeline rank) and chained as the pipeline chains them give
the unpipelined model's loss, and their gradients summed as ``find_tied`` + ``sync_tied_grads`` sum
them give its gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.user import user_loss, user_spec
from autoslapo.pipeline import build_stage_modules, find_tied
from autoslapo.plan import apply_schedule, chunk_bounds

EXAMPLE = Path(__file__).resolve().parents[2] / "experiments" / "my_model.py"

# Python around the loop: a mask built before it and passed to every block, blocks that return tuples,
# a parameter of the root itself, an ``except Exception`` around the loop.
ODD = '''
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, mask):
        return torch.tanh(self.lin(x)) * mask, "extra"

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.body = nn.Module()
        self.body.blocks = nn.ModuleList(Block() for _ in range(4))
        self.out = nn.Linear(8, 1)

    def forward(self, x, y):
        h = x * self.scale
        mask = (x > -10).float()
        try:
            for b in self.body.blocks:
                h = b(h, mask)[0]
        except Exception:
            raise
        return ((self.out(h) - y) ** 2).mean()

def build():
    return Net()

def batch(micro_batch, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(micro_batch, 8, generator=g), "y": torch.randn(micro_batch, 1, generator=g)}

layers = "body.blocks"
'''


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _chain(path: Path, config: ScheduleConfig) -> None:
    spec = user_spec(path)
    ref = build_model(spec, seed=0)
    batch = example_batch(spec, 4, seed=1)
    want = user_loss(ref(**batch))
    want.backward()
    chunks = config.pp * config.virtual_stages
    # one model a stage, as every pipeline rank builds its own
    copies = [build_model(spec, seed=0) for _ in range(chunks)]
    stages, tied = [], set()
    for s, model in enumerate(copies):
        model.load_state_dict(ref.state_dict())
        built, adapter = build_stage_modules(apply_schedule(model, spec, config))
        stages.append(built[s])
        if s == 0:  # what a rank's find_tied finds among all the stages of its model (rank 0 holds stage 0)
            tied = {id(t.param) for t in find_tied(built, chunks, 0)}
    assert adapter.input_keys == tuple(batch)
    assert [st.bounds for st in stages] == chunk_bounds(spec.layers, chunks)  # smaller chunks at the ends
    # forward: what one stage sends is detached and received as a leaf by the next
    inputs: tuple[Any, ...] = tuple(batch[k] for k in adapter.input_keys)
    sent: list[tuple[torch.Tensor, torch.Tensor]] = []
    for st in stages[:-1]:
        out = st(*inputs)
        hidden = out[0].detach().requires_grad_(True)
        sent.append((out[0], hidden))
        inputs = (hidden, *out[1:])
        assert all(a is b for a, b in zip(out[1:], batch.values(), strict=True))  # the batch travels along
    loss = stages[-1](*inputs)
    assert loss.shape == (1,)
    torch.testing.assert_close(loss[0], want)
    loss.sum().backward()
    for out, hidden in reversed(sent):
        out.backward(hidden.grad)
    # every parameter of the model: the sum over the stages' copies (None = zero) is the reference grad
    for name, p in ref.named_parameters():
        grads = [dict(m.named_parameters())[name].grad for m in copies]
        got = sum((g for g in grads if g is not None), torch.zeros_like(p))
        torch.testing.assert_close(got, p.grad, msg=name)
        held = [any(q is dict(m.named_parameters())[name] for q in st.parameters())
                for m, st in zip(copies, stages, strict=True)]
        # a block's parameters on its stage only; the rest on every stage, tied (their gradients summed)
        assert sum(held) == 1 or all(held), name
        assert (sum(held) > 1) == (id(dict(copies[0].named_parameters())[name]) in tied), name


@pytest.mark.parametrize("config", [
    ScheduleConfig(pp=2, grad_accum=2),
    ScheduleConfig(pp=2, grad_accum=2, ckpt_ratio=1.0, pipeline_schedule="interleaved", virtual_stages=2),
    ScheduleConfig(pp=3, grad_accum=3, ckpt_ratio=0.5),  # 4 blocks in stages of 1, 2, 1
], ids=["pp2", "interleaved-ckpt", "uneven"])
def test_stages_of_the_worked_example_give_its_loss_and_gradients(config: ScheduleConfig) -> None:
    _chain(EXAMPLE, config)


def test_stages_of_a_forward_with_context_tuples_and_root_parameters(tmp_path: Path) -> None:
    path = tmp_path / "odd.py"
    path.write_text(ODD)
    _chain(path, ScheduleConfig(pp=4, grad_accum=4))


def test_the_model_is_left_unchanged() -> None:
    spec = user_spec(EXAMPLE)
    model = build_model(spec, seed=0)
    blocks = list(model.blocks)
    stages, _ = build_stage_modules(apply_schedule(model, spec, ScheduleConfig(pp=2, grad_accum=2)))
    assert list(model.blocks) == blocks and stages[0].shell is not model
    shell = stages[1].shell  # stage 1 of 2: blocks 2 and 3, the first entered with the hidden received
    assert shell.embed is model.embed and shell.blocks[3] is blocks[3] and shell.blocks[2].block is blocks[2]
    assert [type(b).__name__ for b in shell.blocks] == ["PassThrough", "PassThrough", "StageBlock", "Block"]


def test_pipeline_stages_need_layers_and_a_block_a_chunk(tmp_path: Path) -> None:
    bare = tmp_path / "bare.py"
    bare.write_text(ODD.replace('layers = "body.blocks"', ""))
    with pytest.raises(ConfigError, match="pipeline stages need the model file to declare layers"):
        ScheduleConfig(pp=2, grad_accum=2).validate(user_spec(bare))
    ScheduleConfig(pp=3, grad_accum=3).validate(user_spec(EXAMPLE))  # 4 blocks: 1, 2, 1
    with pytest.raises(ConfigError, match="pipeline chunks must each hold a layer: got 4 layers for pp=5"):
        ScheduleConfig(pp=5, grad_accum=5).validate(user_spec(EXAMPLE))


def test_the_cost_of_an_uneven_split_is_its_busiest_rank() -> None:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.cost import estimate

    spec = user_spec(EXAMPLE)  # 4 blocks
    cluster = ClusterSpec(gpus=3, gpu_type="a100-80gb")
    three = estimate(spec, ScheduleConfig(pp=3, grad_accum=6), cluster)  # 1, 2, 1: a rank of 2 blocks
    two = estimate(spec, ScheduleConfig(pp=2, dp=1, grad_accum=6), ClusterSpec(gpus=2, gpu_type="a100-80gb"))
    # pp 3 runs no rank with fewer blocks than pp 2's (2 each) and adds a stage's bubble
    assert three.time.bubble > two.time.bubble and three.memory.params <= two.memory.params
