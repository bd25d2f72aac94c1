"""Vocabulary-parallel cross-entropy: the loss computed on logits that stay sharded by vocabulary.

With a vocabulary-parallel head (``vocab_parallel_head``) each tensor-parallel rank computes the
logits of its ``V/t`` slice of the vocabulary. Gathering them for the model's own loss costs every
rank the whole ``tokens x V`` logits and their fp32 softmax, the largest activations of a model
with a big vocabulary. Megatron-LM's vocab-parallel cross-entropy (Shoeybi et al., 2019, section 3)
never gathers them: per token, the maximum logit, the sum of exponentials and the target's logit
are each reduced over the group as one scalar, so every rank keeps only its slice. Here:

* :func:`vocab_parallel_cross_entropy` is that loss as an autograd function on plain
  ``torch.distributed`` calls (gloo, nccl or a fake group), mean over tokens whose label is not
  ``-100`` (what ``torch.nn.functional.cross_entropy`` and transformers' losses compute);
* the ``vocab_parallel_loss`` primitive, on the model's root, makes a call with ``labels`` return
  that loss: it takes the labels out of the call (so the model's own loss, which needs whole
  logits, never runs), keeps the head's output sharded for that call and puts the loss in the
  output's ``loss``. ``output.logits`` is then this rank's vocabulary shard (padded columns
  included). A call without labels is unchanged: the head gathers whole logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["VocabParallelLoss", "vocab_parallel_cross_entropy"]

IGNORE_INDEX = -100


def _all_reduce(x: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any, start: int,
                vocab: int, dtype: torch.dtype) -> torch.Tensor:
        x = logits.to(dtype)
        local = x.shape[-1]
        if start + local > vocab:  # the padded columns of the last shard take no probability
            x = x.clone()
            x[..., max(vocab - start, 0):] = float("-inf")
        peak = x.amax(dim=-1)
        _all_reduce(peak, dist.ReduceOp.MAX, group)
        x = x - peak.unsqueeze(-1)
        exp = x.exp()
        total = exp.sum(dim=-1)
        _all_reduce(total, dist.ReduceOp.SUM, group)
        valid = target != IGNORE_INDEX
        mine = valid & (target >= start) & (target < start + local)
        index = (target - start).clamp(0, local - 1)
        picked = x.gather(-1, index.unsqueeze(-1)).squeeze(-1) * mine
        _all_reduce(picked, dist.ReduceOp.SUM, group)
        count = valid.sum()
        loss = ((total.log() - picked) * valid).sum() / count
        exp /= total.unsqueeze(-1)  # this rank's slice of the softmax, for backward
        ctx.save_for_backward(exp, index, mine, valid, count)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        softmax, index, mine, valid, count = ctx.saved_tensors
        # d loss / d logit_j = (softmax_j - [j == target]) / count for every counted token
        g = softmax
        g.scatter_add_(-1, index.unsqueeze(-1), -mine.unsqueeze(-1).to(g.dtype))
        g *= (valid.to(g.dtype) * (grad / count)).unsqueeze(-1)
        return g.to(ctx.logits_dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, group: Any, start: int,
                                 vocab: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` sharded by vocabulary over ``group``.

    Takes: this rank's logits ``[..., V_local]`` (columns ``start .. start + V_local`` of the
    vocabulary; columns at or past ``vocab`` are padding and take no probability), the targets
    ``[...]`` (global token ids, ``-100`` ignored), the tensor-parallel group and the true
    vocabulary size; ``dtype``, the precision of the softmax (default: the logits', at least fp32).
    Returns: the loss, the same on every rank, in ``dtype``; its gradient reaches only
    this rank's logits. Equals ``F.cross_entropy(whole_logits, target, ignore_index=-100)``.
    """
    if logits.shape[:-1] != target.shape:
        raise ScheduleError(f"vocab-parallel cross-entropy needs one target a logit row: got logits "
                            f"{tuple(logits.shape)} and targets {tuple(target.shape)}")
    dtype = dtype or torch.promote_types(logits.dtype, torch.float32)
    out: torch.Tensor = _VocabParallelCE.apply(logits, target, group, start, vocab, dtype)
    return out


def shift_for_causal(labels: torch.Tensor) -> torch.Tensor:
    """Targets of a causal LM: position ``i`` predicts token ``i + 1``; the last predicts nothing."""
    return F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)


class VocabParallelLoss:
    """The loss of a model whose head is vocabulary-parallel (see the module docstring).

    ``__call__(logits_shard, labels)``: the mean loss from this rank's logits shard (labels shifted
    first for a causal model), e.g. a pipeline's last-stage ``loss_fn`` after :meth:`for_pipeline`.
    """

    def __init__(self, head: Schedule, causal: bool) -> None:
        info = head.meta.get("vocab_parallel_head")
        if info is None:
            raise ScheduleError(
                f"vocab_parallel_loss needs a vocabulary-parallel head: {head.path!r} is not one; "
                f"apply sch[{head.path!r}].vocab_parallel_head() first"
            )
        self.info = info
        self.group = head.group
        self.rank = head.rank
        self.causal = causal

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        start = self.rank * logits.shape[-1]
        if self.causal:  # as transformers' causal-LM loss: shifted labels, logits cast to fp32
            return vocab_parallel_cross_entropy(logits, shift_for_causal(labels), group=self.group, start=start,
                                                vocab=self.info["vocab"], dtype=torch.float32)
        # as BERT's masked-LM loss (``CrossEntropyLoss`` on the logits as they are)
        return vocab_parallel_cross_entropy(logits, labels, group=self.group, start=start, vocab=self.info["vocab"])

    def for_pipeline(self) -> VocabParallelLoss:
        """Keep the head's output sharded on every call (a pipeline stage's head never sees labels:
        the pipeline hands its output to this loss). Returns self, the stage's ``loss_fn``."""
        self.info["gather"] = False
        return self


def vocab_parallel_loss(sch: Schedule, head: str, *, causal: bool) -> VocabParallelLoss:
    """Compute the model's loss vocabulary-parallel when it is called with ``labels``.

    Takes: the path of the (already vocabulary-parallel) head under this node, and whether the
    model is causal (labels shifted by one, as transformers' causal-LM loss does). A call with
    ``labels=`` runs the model without them, with the head's output left sharded, and returns the
    output with ``loss`` set from :func:`vocab_parallel_cross_entropy` and ``logits`` this rank's
    shard (``meta["sharded_outputs"]`` says so after such a call: name -> (dim, whole size)).
    Returns: the :class:`VocabParallelLoss` (also in ``meta["vocab_parallel_loss"]``).
    Raises: ScheduleError when ``head`` is not vocabulary-parallel.
    """
    if head not in sch:
        raise ScheduleError(f"vocab_parallel_loss: no module {head!r} under {sch.path or '<root>'!r}")
    loss = VocabParallelLoss(sch[head], causal)
    sch.meta["vocab_parallel_loss"] = loss
    if sch.group_size == 1:
        return loss
    pending: list[torch.Tensor] = []

    def pre_hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        labels = kwargs.pop("labels", None)
        loss.info["gather"] = labels is None
        pending.clear()
        if labels is not None:
            pending.append(labels)
        return args, kwargs

    def post_hook(_m: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any], out: Any) -> Any:
        loss.info["gather"] = True
        if not pending:
            sch.meta.pop("sharded_outputs", None)
            return out
        # what this call returns sharded: ``Verify`` gathers it to compare with the whole model
        sch.meta["sharded_outputs"] = {"logits": (-1, loss.info["vocab"])}
        labels = pending.pop()
        logits = out["logits"] if isinstance(out, dict) else out.logits
        value = loss(logits, labels)
        fields = {k: v for k, v in out.items() if k != "loss"}
        return type(out)(loss=value, **fields)

    hooks = sch.meta.setdefault("hooks", [])
    hooks.append(sch.mod.register_forward_pre_hook(pre_hook, with_kwargs=True))
    hooks.append(sch.mod.register_forward_hook(post_hook, with_kwargs=True))
    return loss
