"""attention_kernel: eager vs sdpa give the same outputs and gradients; flash needs CUDA."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives.kernel import flash_available
from autoslapo.schedule import create_schedule


class SelfAttention(nn.Module):
    """A hand-written attention, the kind a user model has."""

    def __init__(self, dim: int = 32, heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        probs = self.drop(torch.softmax(scores, dim=-1))
        out = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn = SelfAttention(dropout=dropout)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attn(x, mask))


def _check_same(ref: nn.Module, new: nn.Module, *inputs: torch.Tensor, **kw: torch.Tensor) -> None:
    out_r, out_n = ref(*inputs, **kw), new(*inputs, **kw)
    if not isinstance(out_r, torch.Tensor):
        out_r, out_n = out_r.logits, out_n.logits
    torch.testing.assert_close(out_n, out_r, rtol=1e-5, atol=1e-5)
    out_r.square().mean().backward()
    out_n.square().mean().backward()
    grads = dict(new.named_parameters())
    for n, p in ref.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n].grad, p.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {n}")


def _mask(s: int) -> torch.Tensor:
    return torch.triu(torch.full((s, s), float("-inf")), diagonal=1)


def test_generic_attention_sdpa_matches_eager_and_restores() -> None:
    torch.manual_seed(0)
    block = Block()
    ref = copy.deepcopy(block)
    original = block.attn
    sch = create_schedule(block)
    sch["attn"].attention_kernel("sdpa")
    assert "scaled_dot_product_attention" in block.attn.code or "attention_core" in block.attn.code
    assert sch["attn"].meta["attn_impl"] == "sdpa"
    x = torch.randn(2, 6, 32)
    _check_same(ref, block, x, _mask(6))
    sch["attn"].attention_kernel("eager")
    assert block.attn is original and sch["attn"].mod is original


def test_generic_attention_errors() -> None:
    sch = create_schedule(Block())
    with pytest.raises(ScheduleError, match="unknown attention kernel 'xformers'"):
        sch["attn"].attention_kernel("xformers")
    with pytest.raises(ScheduleError, match="no attention core"):
        sch["norm"].attention_kernel("sdpa")
    with pytest.raises(ScheduleError, match=r"p=0\.1"):
        create_schedule(Block(dropout=0.1))["attn"].attention_kernel("sdpa")


@pytest.mark.skipif(flash_available(torch.device("cuda")), reason="this host has flash attention")
def test_flash_on_cpu_is_a_clear_error() -> None:
    sch = create_schedule(Block())
    with pytest.raises(ScheduleError, match="'flash' needs a CUDA device"):
        sch["attn"].attention_kernel("flash")


def _tiny_bert(impl: str) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation=impl,
    )
    torch.manual_seed(0)
    return BertForMaskedLM(cfg)


def _tiny_gpt2(impl: str) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=512,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=impl,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("build", [_tiny_bert, _tiny_gpt2], ids=["bert", "gpt2"])
def test_hf_eager_and_sdpa_agree(build) -> None:  # type: ignore[no-untyped-def]
    model = build("eager")
    ref = copy.deepcopy(model)
    sch = create_schedule(model)
    sch.attention_kernel("sdpa")
    assert model.config._attn_implementation == "sdpa" and sch.meta["attn_impl"] == "sdpa"
    ids = torch.randint(0, 512, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # padding exercises the mask path of both kernels
    _check_same(ref, model, input_ids=ids, attention_mask=mask)
    sch.attention_kernel("eager")
    assert model.config._attn_implementation == "eager"


def test_hf_kernel_is_model_wide() -> None:
    sch = create_schedule(_tiny_bert("eager"))
    with pytest.raises(ScheduleError, match="model-wide"):
        sch["bert.encoder.layer.0.attention.self"].attention_kernel("sdpa")


@pytest.mark.gpu
def test_flash_on_cuda_matches_sdpa() -> None:
    model = _tiny_gpt2("sdpa").cuda().half()
    ref = copy.deepcopy(model)
    sch = create_schedule(model)
    sch.attention_kernel("flash")
    ids = torch.randint(0, 512, (2, 16), device="cuda")
    torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=2e-2, atol=2e-2)
