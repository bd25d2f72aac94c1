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

The chunked kernel (``kernel="chunked"``, any tp, also 1) goes further: no call with labels ever
holds ``tokens x V/t`` logits. :func:`chunked_cross_entropy` takes the head's *input* and weight
and computes the head's matmul, the (vocabulary-parallel) log-softmax and the loss chunk by chunk
over tokens, keeping per token only its log-sum-exp; backward recomputes each chunk's logits, so
the peak holds one chunk of logits (as Liger-Kernel's fused linear cross-entropy and Megatron's
chunked loss do). The head then returns its input on such a call, the loss is set from it and
``logits`` is left out of the output (``meta["omitted_outputs"]`` says so; ``Verify`` compares the
rest).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoslapo.config import LOSS_CHUNK_TOKENS, LOSS_KERNELS
from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["CHUNK_TOKENS", "LOSS_KERNELS", "VocabParallelLoss", "chunked_cross_entropy",
           "vocab_parallel_cross_entropy"]

IGNORE_INDEX = -100
CHUNK_TOKENS = LOSS_CHUNK_TOKENS


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


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int, vocab: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's logits as the head computes them (under the ambient autocast) and in ``dtype``,
    the padded columns of the last shard at -inf. Without an ambient autocast, a weight of another
    dtype than ``h`` is cast to ``h``'s, as autocast would: the loss runs in a hook after a forward
    that ran under autocast (16-bit activations, fp32 weights)."""
    if h.dtype != weight.dtype and not torch.is_autocast_enabled(h.device.type):
        weight = weight.to(h.dtype)
        bias = bias.to(h.dtype) if bias is not None else None
    logits = F.linear(h, weight, bias)
    x = logits.to(dtype)
    if start + x.shape[-1] > vocab:
        x = x.clone() if x is logits else x
        x[..., max(vocab - start, 0):] = float("-inf")
    return logits, x


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                target: torch.Tensor, group: Any, start: int, vocab: int, chunk: int,
                dtype: torch.dtype) -> torch.Tensor:
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=dtype, device=hidden.device)
        picked = torch.empty(n, dtype=dtype, device=hidden.device)
        local = weight.shape[0]
        valid = target != IGNORE_INDEX
        mine = valid & (target >= start) & (target < start + local)
        index = (target - start).clamp(0, local - 1)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            _, x = _chunk_logits(hidden[a:b], weight, bias, start, vocab, dtype)
            peak = x.amax(dim=-1)
            _all_reduce(peak, dist.ReduceOp.MAX, group)
            total = (x - peak.unsqueeze(-1)).exp().sum(dim=-1)
            _all_reduce(total, dist.ReduceOp.SUM, group)
            lse[a:b] = peak + total.log()
            picked[a:b] = x.gather(-1, index[a:b].unsqueeze(-1)).squeeze(-1) * mine[a:b]
            del x
        _all_reduce(picked, dist.ReduceOp.SUM, group)
        count = valid.sum()
        loss = ((lse - picked) * valid).sum() / count
        ctx.save_for_backward(hidden, weight, bias, lse, index, mine, valid, count)
        ctx.meta = (start, vocab, chunk, dtype)
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, lse, index, mine, valid, count = ctx.saved_tensors
        start, vocab, chunk, dtype = ctx.meta
        device, cast, cast_dtype = ctx.autocast
        grad_h = torch.zeros_like(hidden)
        grad_w = torch.zeros_like(weight)
        grad_b = torch.zeros_like(bias) if bias is not None else None
        scale = valid.to(dtype) * (grad / count)
        w = weight.detach().requires_grad_()
        bb = bias.detach().requires_grad_() if bias is not None else None
        for a in range(0, hidden.shape[0], chunk):
            b = min(a + chunk, hidden.shape[0])
            h = hidden[a:b].detach().requires_grad_()
            with torch.enable_grad(), torch.autocast(device, dtype=cast_dtype, enabled=cast):
                logits, x = _chunk_logits(h, w, bb, start, vocab, dtype)
            # d loss / d logit_j = (softmax_j - [j == target]) * scale for every counted token
            g = (x.detach() - lse[a:b].unsqueeze(-1)).exp_()
            g.scatter_add_(-1, index[a:b].unsqueeze(-1), -mine[a:b].unsqueeze(-1).to(g.dtype))
            g *= scale[a:b].unsqueeze(-1)
            wrt = (h, w) if bb is None else (h, w, bb)
            grads = torch.autograd.grad(logits, wrt, g.to(logits.dtype))
            grad_h[a:b] = grads[0]
            grad_w += grads[1]
            if grad_b is not None:
                grad_b += grads[2]
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          target: torch.Tensor, *, group: Any = None, start: int = 0, vocab: int | None = None,
                          chunk: int = CHUNK_TOKENS, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``F.linear(hidden, weight, bias)`` without ever holding all its logits.

    Takes: the head's input ``[..., H]``, its weight ``[V_local, H]`` (rows ``start .. start +
    V_local`` of the vocabulary; rows at or past ``vocab`` are padding and take no probability) and
    bias, the targets ``[...]`` (global token ids, ``-100`` ignored), the tensor-parallel group
    (``None``: the weight is the whole vocabulary), ``chunk`` tokens at a time, ``dtype`` of the
    softmax (default: the logits', at least fp32).
    Returns: the loss, the same on every rank; it equals ``F.cross_entropy(F.linear(hidden, weight,
    bias), target, ignore_index=-100)`` on whole logits, and so do its gradients, which reach
    ``hidden``, ``weight`` and ``bias``. Backward recomputes each chunk's logits.
    Raises: ScheduleError for mismatched shapes or a chunk < 1.
    """
    if hidden.shape[:-1] != target.shape or hidden.shape[-1] != weight.shape[-1]:
        raise ScheduleError(f"chunked cross-entropy needs one target a hidden row and a weight [V, H]: got hidden "
                            f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}, targets {tuple(target.shape)}")
    if chunk < 1:
        raise ScheduleError(f"chunked cross-entropy needs chunk >= 1 tokens: got {chunk}")
    vocab = start + weight.shape[0] if vocab is None else vocab
    if dtype is None:
        logit_dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(
            hidden.device.type) else torch.promote_types(hidden.dtype, weight.dtype)
        dtype = torch.promote_types(logit_dtype, torch.float32)
    out: torch.Tensor = _ChunkedCE.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias, target.reshape(-1),
                                         group, start, vocab, chunk, dtype)
    return out


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


_LOSS_INFO = "_autoslapo_loss_info"
_HEAD_INNER = "_autoslapo_head_inner_forward"


def _deferring_head_forward(self: nn.Module, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # A bound method (not a closure) so that copy.deepcopy rebinds it to the copy. On a call whose
    # loss is chunked, the head hands its input on instead of computing logits.
    if self.__dict__[_LOSS_INFO].get("defer"):
        return hidden
    inner = self.__dict__.get(_HEAD_INNER)
    fn = inner if inner is not None else types.MethodType(type(self).forward, self)
    return fn(hidden, *args, **kwargs)


class VocabParallelLoss:
    """The loss of a model whose head is vocabulary-parallel (see the module docstring).

    ``__call__(output, labels)``: the mean loss (labels shifted first for a causal model) from this
    rank's logits shard (``kernel="eager"``) or, for the chunked kernel, from the head's input (what
    a deferring head returns), e.g. a pipeline's last-stage ``loss_fn`` after :meth:`for_pipeline`.
    With ``kernel="chunked"`` the head need not be vocabulary-parallel (tp = 1: the whole vocabulary).
    """

    def __init__(self, head: Schedule, causal: bool, kernel: str = "eager") -> None:
        if kernel not in LOSS_KERNELS:
            raise ScheduleError(f"loss kernel must be one of {', '.join(LOSS_KERNELS)}: got {kernel!r}")
        info = head.meta.get("vocab_parallel_head")
        if info is None and (kernel == "eager" or head.group_size > 1):
            raise ScheduleError(
                f"vocab_parallel_loss needs a vocabulary-parallel head: {head.path!r} is not one; "
                f"apply sch[{head.path!r}].vocab_parallel_head() first"
            )
        if info is None:
            weight = head.mod._parameters.get("weight")
            if weight is None or weight.dim() != 2:
                raise ScheduleError(f"the chunked loss needs a head with a 2-D weight [vocab, hidden]: {head.path!r} "
                                    f"is a {type(head.mod).__name__}")
            info = {"vocab": weight.shape[0], "pad": 0, "gather": True}
            head.meta["loss_head"] = info
        self.info = info
        self.head = head.mod
        self.group = head.group if head.group_size > 1 else None
        self.rank = head.rank if head.group_size > 1 else 0
        self.causal = causal
        self.kernel = kernel
        if kernel == "chunked":
            mod = head.mod
            mod.__dict__[_LOSS_INFO] = info
            if getattr(mod.__dict__.get("forward"), "__func__", None) is not _deferring_head_forward:
                mod.__dict__[_HEAD_INNER] = mod.__dict__.get("forward")
                mod.forward = types.MethodType(_deferring_head_forward, mod)  # type: ignore[method-assign]

    def _targets(self, labels: torch.Tensor) -> torch.Tensor:
        # as transformers' causal-LM loss: shifted labels
        return shift_for_causal(labels) if self.causal else labels

    def __call__(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # causal: as transformers' causal-LM loss (logits cast to fp32); masked: as BERT's
        # ``CrossEntropyLoss`` on the logits as they are
        dtype = torch.float32 if self.causal else None
        vocab = self.info["vocab"]
        if self.kernel == "chunked":
            weight = self.head.weight
            bias = getattr(self.head, "bias", None)
            if not isinstance(weight, torch.Tensor):
                raise ScheduleError(f"the chunked loss needs the head's weight tensor: got {type(weight).__name__}")
            bias = bias if isinstance(bias, torch.Tensor) else None
            return chunked_cross_entropy(output, weight, bias, self._targets(labels), group=self.group,
                                         start=self.rank * weight.shape[0], vocab=vocab, dtype=dtype)
        start = self.rank * output.shape[-1]
        return vocab_parallel_cross_entropy(output, self._targets(labels), group=self.group, start=start,
                                            vocab=vocab, dtype=dtype)

    def defer(self, on: bool) -> None:
        """Keep the head's output sharded (and, chunked, hand the head's input on) while ``on``."""
        self.info["gather"] = not on
        self.info["defer"] = on and self.kernel == "chunked"

    def for_pipeline(self) -> VocabParallelLoss:
        """Keep the head's output sharded (chunked: the head's input) on every call: a pipeline
        stage's head never sees labels, the pipeline hands its output to this loss. Returns self,
        the stage's ``loss_fn``."""
        self.defer(True)
        return self


def vocab_parallel_loss(sch: Schedule, head: str, *, causal: bool, kernel: str = "eager") -> VocabParallelLoss:
    """Compute the model's loss vocabulary-parallel when it is called with ``labels``.

    Takes: the path of the head under this node (vocabulary-parallel already, unless ``kernel`` is
    "chunked" on one rank), whether the model is causal (labels shifted by one, as transformers'
    causal-LM loss does), and the kernel: "eager" (the logits' shards) or "chunked"
    (:func:`chunked_cross_entropy` from the head's input; no call with labels holds its logits). A
    call with ``labels=`` runs the model without them, with the head's output left sharded (chunked:
    the head returns its input) and returns the output with ``loss`` set and ``logits`` this rank's
    shard (``meta["sharded_outputs"]`` says so after such a call: name -> (dim, whole size)) or,
    chunked, left out (``meta["omitted_outputs"]``).
    Returns: the :class:`VocabParallelLoss` (also in ``meta["vocab_parallel_loss"]``).
    Raises: ScheduleError when ``head`` is not vocabulary-parallel (eager or tp > 1) or the kernel is unknown.
    """
    if head not in sch:
        raise ScheduleError(f"vocab_parallel_loss: no module {head!r} under {sch.path or '<root>'!r}")
    loss = VocabParallelLoss(sch[head], causal, kernel)
    sch.meta["vocab_parallel_loss"] = loss
    if sch.group_size == 1 and kernel == "eager":
        return loss
    pending: list[torch.Tensor] = []

    def pre_hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        labels = kwargs.pop("labels", None)
        loss.defer(labels is not None)
        pending.clear()
        if labels is not None:
            pending.append(labels)
        return args, kwargs

    def post_hook(_m: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any], out: Any) -> Any:
        loss.defer(False)
        sch.meta.pop("sharded_outputs", None)
        sch.meta.pop("omitted_outputs", None)
        if not pending:
            return out
        labels = pending.pop()
        logits = out["logits"] if isinstance(out, dict) else out.logits
        value = loss(logits, labels)
        if kernel == "chunked":
            # ``logits`` held the head's input: no logits were computed on this call
            sch.meta["omitted_outputs"] = ("logits",)
            fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
        else:
            # what this call returns sharded: ``Verify`` gathers it to compare with the whole model
            sch.meta["sharded_outputs"] = {"logits": (-1, loss.info["vocab"])}
            fields = {k: v for k, v in out.items() if k != "loss"}
        return type(out)(loss=value, **fields)

    hooks = sch.meta.setdefault("hooks", [])
    hooks.append(sch.mod.register_forward_pre_hook(pre_hook, with_kwargs=True))
    hooks.append(sch.mod.register_forward_hook(post_hook, with_kwargs=True))
    return loss
