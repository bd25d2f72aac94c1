"""Shared test helpers: tiny models built from configs (random weights, nothing downloaded).

Plain functions (not only fixtures) so that worker functions run by ``autoslapo.dist.spawn`` in
fresh processes can import them too.
"""

from __future__ import annotations

import os
from typing import Any

from tests.pgfixtures import pg_server  # noqa: F401  (the session's PostgreSQL server, for every folder)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB = 512
SEQ = 8


def tiny_mlp(width: int = 16, hidden: int = 32, seed: int = 0) -> Any:
    """Linear(width, width) -> Linear(width, hidden) -> GELU -> Linear(hidden, width), seeded."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


def bert_config(dropout: float = 0.0, attn_dropout: float | None = None, **kw: Any) -> Any:
    """A 2-layer, hidden-64, 4-head BERT config with eager attention."""
    from transformers import BertConfig

    base = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout if attn_dropout is None else attn_dropout,
        attn_implementation="eager",
    )
    base.update(kw)
    return BertConfig(**base)


def tiny_bert(seed: int = 0, **kw: Any) -> Any:
    """A seeded tiny BertModel (see bert_config)."""
    import torch
    from transformers import BertModel

    torch.manual_seed(seed)
    return BertModel(bert_config(**kw))


def tiny_gpt2(seed: int = 0, lm_head: bool = False, dropout: float = 0.0) -> Any:
    """A seeded tiny GPT-2 (hidden 64, 2 layers, 4 heads); with ``lm_head`` its wte/lm_head are tied."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    cfg = GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg) if lm_head else GPT2Model(cfg)


def token_ids(batch: int = 2, seq: int = SEQ, seed: int = 1) -> Any:
    """Deterministic input ids in [0, VOCAB)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)
