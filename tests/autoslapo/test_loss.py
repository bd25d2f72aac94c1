"""Vocabulary-parallel cross-entropy on 2 gloo ranks equals the cross-entropy of whole logits, in
value and gradient, with padded vocabulary columns and ignored labels."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from autoslapo.dist import spawn
from autoslapo.errors import ScheduleError
from autoslapo.primitives.loss import shift_for_causal, vocab_parallel_cross_entropy

VOCAB = 11  # padded to 12 on 2 ranks: rank 1's last column is padding


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, VOCAB, generator=g, dtype=torch.float64) * 4
    target = torch.randint(0, VOCAB, (3, 7), generator=g)
    target[0, :3] = -100
    target[2, 6] = VOCAB - 1  # the last real column, next to the padding
    return logits, target


def _ranks() -> list[Any]:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    logits, target = _data()
    local = -(-VOCAB // world)
    padded = F.pad(logits, (0, local * world - VOCAB), value=123.0)  # junk in the pad: must not count
    shard = padded[..., rank * local:(rank + 1) * local].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(shard, target, group=dist.group.WORLD, start=rank * local, vocab=VOCAB)
    (loss * 3).backward()
    causal = vocab_parallel_cross_entropy(shard.detach(), shift_for_causal(target), group=dist.group.WORLD,
                                          start=rank * local, vocab=VOCAB)
    assert shard.grad is not None
    return [float(loss), shard.grad, float(causal)]


def test_vocab_parallel_cross_entropy_matches_whole_logits() -> None:
    logits, target = _data()
    whole = logits.clone().requires_grad_(True)
    want = F.cross_entropy(whole.flatten(0, 1), target.flatten(), ignore_index=-100)
    (want * 3).backward()
    assert whole.grad is not None
    causal = F.cross_entropy(logits[:, :-1].flatten(0, 1), target[:, 1:].flatten(), ignore_index=-100)
    out = spawn(_ranks, 2, timeout=120.0)
    assert out[0][0] == out[1][0] == pytest.approx(float(want), abs=1e-12)
    assert out[0][2] == pytest.approx(float(causal), abs=1e-12)
    grad = torch.cat([out[0][1], out[1][1]], dim=-1)
    assert torch.equal(grad[..., VOCAB:], torch.zeros_like(grad[..., VOCAB:]))  # padding gets nothing
    torch.testing.assert_close(grad[..., :VOCAB], whole.grad, rtol=0, atol=1e-12)


def test_vocab_parallel_cross_entropy_single_rank_and_shape_check() -> None:
    logits, target = _data()
    got = vocab_parallel_cross_entropy(logits, target, group=None, start=0, vocab=VOCAB)
    want = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
    assert float(got) == pytest.approx(float(want), abs=1e-12)
    with pytest.raises(ScheduleError, match="one target a logit row"):
        vocab_parallel_cross_entropy(logits, target[:, :3], group=None, start=0, vocab=VOCAB)


def test_vocab_parallel_loss_needs_a_vocab_parallel_head() -> None:
    from autoslapo import create_schedule
    from tests.conftest import tiny_gpt2

    sch = create_schedule(tiny_gpt2(lm_head=True))
    with pytest.raises(ScheduleError, match=r"needs a vocabulary-parallel head.*vocab_parallel_head"):
        sch.vocab_parallel_loss("lm_head", causal=True)
