"""A model written from scratch, tuned by autoslapo as the user's own module (issue 14, point 3).

``autoslapo tune experiments/my_model.py --gpus 4 --backend local`` reads the four names below:
``build`` (the unchanged model), ``batch`` (the forward's keyword inputs, labels included; the
forward returns the loss), ``layers`` (the ModuleList of repeated blocks: checkpointing) and
``family`` (where attention and MLP live inside a block: tensor parallelism and kernels).
A small pre-norm decoder: token + position embeddings, 4 blocks of multi-head attention (an
eager ``softmax(q k^T * scale + mask) v``
core, which ``--attn sdpa`` rewrites to one SDPA call) and a GeLU MLP, a final norm and an untied LM head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import autoslapo

VOCAB, HIDDEN, HEADS, BLOCKS, SEQ = 512, 64, 4, 4, 32


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.num_heads = heads  # tensor parallelism shrinks it to heads / tp (family.attention_attrs)
        self.head_dim = hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)  # causal, additive
        probs = (q @ k.transpose(-2, -1) * self.scale + mask).softmax(-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.out(ctx)


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, heads: int = HEADS, blocks: int = BLOCKS,
                 seq: int = SEQ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def build() -> nn.Module:
    return TinyDecoder()


def batch(micro_batch: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (micro_batch, SEQ), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


layers = "blocks"

family = autoslapo.FamilyDescription(
    name="tiny-decoder",
    model_type="tiny-decoder",
    layers=layers,
    embed_tokens="embed",
    lm_head="head",
    head_tied=False,
    embeddings=("embed", "pos"),
    final=("ln_f", "head"),
    attention="attn",
    attention_input=0,
    qkv=("attn.q", "attn.k", "attn.v"),
    qkv_chunks=1,
    attn_out="attn.out",
    attention_attrs=("num_heads",),
    mlp="mlp",
    mlp_in=("mlp.fc1",),
    mlp_out="mlp.fc2",
    norms=("ln1", "ln2"),
    bias_gelu="mlp",
)
