"""``Verify``: check that the primitives applied inside a ``with`` block left the function unchanged.

    with Verify(sch, (input_ids,)):
        sch["encoder.layer.0.attention.self.query"].shard("weight", 0)
        ...

On enter, a deep copy of the (unscheduled) model and its weights is kept as the reference. On exit,
both models run forward and backward on the same inputs from the same RNG state; every output must
match, and so must every parameter's value and gradient (sharded ones gathered across the tensor-
parallel group by their ShardSpec), within the dtype's tolerance. The first mismatch raises
VerifyError naming the output or parameter and its max abs diff, on every rank (ranks agree on the
verdict through the group, so none is left waiting in a collective).

Dropout: the reference can only match if the scheduled model draws the same random numbers for the
same elements. That holds with no tensor parallelism (checkpointing replays the RNG state), and it
fails whenever dropout acts on sharded activations (head shards, sequence shards, ``fork_rng``).
So ``dropout=None`` (the default) verifies in train mode with dropout on when the schedule is
RNG-equivalent (group size 1 and no ``fork_rng``), else in eval mode; ``dropout=True`` forces train
mode (right when all dropout sits on replicated activations), ``dropout=False`` forces eval mode.
``Verify.mode`` tells which was used.

The default loss is ``sum(output_i * r_i)`` with fixed random ``r_i``: a plain sum would give a zero
gradient through a final LayerNorm and hide mistakes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autoslapo.errors import VerifyError
from autoslapo.primitives.tp import ShardSpec, gather_shards, shard_spec
from autoslapo.schedule import Schedule

__all__ = ["Verify", "default_tolerance"]

_TOL = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Return (rtol, atol) for comparing tensors of ``dtype``.

    An element passes when ``|got - want| <= atol * max(1, max|want|) + rtol * |want|``.
    """
    return _TOL.get(dtype, (1e-4, 1e-5))


def flatten_outputs(out: Any, name: str = "output") -> list[tuple[str, torch.Tensor]]:
    """Return the floating tensors in a (nested) model output, with dotted names, in order."""
    if isinstance(out, torch.Tensor):
        return [(name, out)] if out.is_floating_point() else []
    if isinstance(out, Mapping):
        return [item for k, v in out.items() for item in flatten_outputs(v, f"{name}.{k}")]
    if isinstance(out, Sequence) and not isinstance(out, str | bytes):
        return [item for i, v in enumerate(out) for item in flatten_outputs(v, f"{name}[{i}]")]
    return []


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, Mapping):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return type(x)(_clone(v) for v in x)
    return x


def _default_loss(out: Any) -> torch.Tensor:
    total: torch.Tensor | None = None
    for i, (_, t) in enumerate(flatten_outputs(out)):
        gen = torch.Generator().manual_seed(7919 + i)
        weight = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t)
        term = (t * weight).sum()
        total = term if total is None else total + term
    if total is None:
        raise VerifyError("the model output has no floating tensor to differentiate; pass loss_fn=")
    return total


class Verify:
    """Context manager that checks a schedule keeps outputs and gradients (module docstring).

    Takes: a schedule node (its root model is checked), example inputs (a tuple of positional
    arguments, a dict of keyword arguments, or one tensor), ``loss_fn(output) -> scalar``, optional
    ``rtol``/``atol`` (default: by dtype), ``dropout`` (None: auto) and the RNG ``seed``.
    Raises: VerifyError on exit at the first mismatch; VerifyError on enter for a meta-device model.
    """

    def __init__(
        self,
        sch: Schedule,
        example_inputs: Any,
        *,
        loss_fn: Callable[[Any], torch.Tensor] | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        dropout: bool | None = None,
        seed: int = 1234,
    ) -> None:
        self.sch = sch.root()
        if isinstance(example_inputs, Mapping):
            self.args: tuple[Any, ...] = ()
            self.kwargs: dict[str, Any] = dict(example_inputs)
        elif isinstance(example_inputs, tuple | list):
            self.args, self.kwargs = tuple(example_inputs), {}
        else:
            self.args, self.kwargs = (example_inputs,), {}
        self.loss_fn = loss_fn or _default_loss
        self.rtol, self.atol = rtol, atol
        self.dropout = dropout
        self.seed = seed
        self.reference: nn.Module | None = None
        self.mode = ""
        self.checked: list[str] = []
        self.skipped: list[str] = []

    # -- context ----------------------------------------------------------------------------------

    def __enter__(self) -> Verify:
        model = self.sch.mod
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            raise VerifyError(
                "Verify needs real weights but the model is on the meta device; verify a small real "
                "instance of the same model, or build() it first"
            )
        self.reference = copy.deepcopy(model)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.run()

    # -- checks -----------------------------------------------------------------------------------

    def _group(self) -> Any:
        return self.sch.group if self.sch.group_size > 1 else None

    def _agree(self, error: str | None) -> None:
        # Every rank learns every rank's verdict, so all raise together (no rank hangs).
        group = self._group()
        if group is not None:
            errors: list[str | None] = [None] * dist.get_world_size(group)
            dist.all_gather_object(errors, error, group=group)
            for rank, err in enumerate(errors):
                if err is not None:
                    error = err if rank == dist.get_rank(group) else f"{err} (seen on TP rank {rank})"
                    break
        if error is not None:
            raise VerifyError(error)

    def _compare(self, what: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
        if got.shape != want.shape:
            return f"{what} has shape {tuple(got.shape)}, the reference {tuple(want.shape)}"
        rtol_d, atol_d = default_tolerance(want.dtype)
        rtol = self.rtol if self.rtol is not None else rtol_d
        atol = self.atol if self.atol is not None else atol_d
        g, w = got.detach(), want.detach().to(got.device)
        # Fast path: most values (unsharded parameters, gathered shards) are bit-identical.
        if g.dtype == w.dtype and torch.equal(g, w):
            self.checked.append(what)
            return None
        # Compare in float32 or wider (never below): in-place ops keep this a few passes over
        # memory, which matters for vocabulary-sized embeddings and their gradients.
        dtype = torch.promote_types(torch.promote_types(g.dtype, w.dtype), torch.float32)
        g, w = g.to(dtype), w.to(dtype)
        diff = (g - w).abs_()
        # atol scales with the tensor's magnitude: a gradient summed over many positions carries
        # absolute rounding error proportional to its largest entries, not to each entry.
        w_abs = w.abs()
        scale = max(1.0, float(w_abs.max())) if w.numel() else 1.0
        bad = diff > w_abs.mul_(rtol).add_(atol * scale)
        if bool(bad.any()):
            return (
                f"{what} differs from the reference: max abs diff {diff.max().item():.3g} "
                f"(rtol={rtol}, atol={atol}, {int(bad.sum())} of {bad.numel()} elements off)"
            )
        self.checked.append(what)
        return None

    def _rng_equivalent(self) -> bool:
        if self.sch.group_size > 1:
            return False
        return not any("fork_rng" in node.meta for _, node in self.sch.named_schedules())

    def run(self) -> None:
        """Run both models and compare; called by ``__exit__``. Raises VerifyError on a mismatch."""
        if self.reference is None:
            raise VerifyError("Verify.run() needs the reference taken on enter; use it as a context manager")
        ref, model = self.reference, self.sch.mod
        train = self._rng_equivalent() if self.dropout is None else self.dropout
        self.mode = "train (dropout on)" if train else "eval (dropout off)"
        was_training = model.training
        devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
        try:
            with torch.random.fork_rng(devices=devices):
                outs = []
                for m in (ref, model):
                    m.train(train)
                    m.zero_grad(set_to_none=True)
                    torch.manual_seed(self.seed)
                    outs.append(m(*_clone(self.args), **_clone(self.kwargs)))
                outs[1] = self._whole(outs[1])
                self._check_outputs(self._without_omitted(outs[0]), outs[1])
                for out in outs:
                    torch.manual_seed(self.seed + 1)
                    self.loss_fn(out).backward()
                self._check_params(ref, model)
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    def _whole(self, out: Any) -> Any:
        """The scheduled model's output with the outputs it returned sharded gathered (e.g. the
        logits of ``vocab_parallel_loss``), so they compare with the reference's (gradient: split)."""
        from autoslapo.primitives import comm

        sharded = self.sch.meta.get("sharded_outputs") or {}
        for name, (dim, size) in sharded.items():
            full = comm.apply(out[name], "all_gather", dim=dim, group=self.sch.group)
            out[name] = full.narrow(dim, 0, size)
        return out

    def _without_omitted(self, out: Any) -> Any:
        """The reference's output less what the scheduled model leaves out of its own (the logits a
        chunked loss never computes: ``meta["omitted_outputs"]``), for comparing the rest."""
        omitted = self.sch.meta.get("omitted_outputs") or ()
        if not omitted or not isinstance(out, Mapping):
            return out
        return {k: v for k, v in out.items() if k not in omitted}

    def _check_outputs(self, want: Any, got: Any) -> None:
        wants, gots = flatten_outputs(want), flatten_outputs(got)
        error = None
        if [n for n, _ in wants] != [n for n, _ in gots]:
            error = (
                f"outputs differ in structure: reference {[n for n, _ in wants]}, "
                f"scheduled {[n for n, _ in gots]}"
            )
        else:
            for (name, w), (_, g) in zip(wants, gots, strict=True):
                error = self._compare(name, g, w)
                if error:
                    break
        self._agree(error)

    def _check_params(self, ref: nn.Module, model: nn.Module) -> None:
        mine = dict(model.named_parameters())
        error: str | None = None
        matched = 0
        for name, want in ref.named_parameters():
            p = mine.get(name)
            if p is None:
                self.skipped.append(name)  # renamed by a replace: nothing to compare against
                continue
            matched += 1
            spec: ShardSpec | None = shard_spec(p)
            # Gather on every rank in the same order even after a local mismatch (collectives).
            value = gather_shards(p, spec) if spec is not None else p.detach()
            has_grad = p.grad is not None
            grad_local = p.grad if p.grad is not None else torch.zeros_like(p)
            grad = gather_shards(grad_local, spec) if spec is not None else grad_local
            if error is not None:
                continue
            error = self._compare(f"parameter {name}", value, want)
            if error is None and (want.grad is not None) != has_grad:
                error = (
                    f"gradient of parameter {name} is {'missing' if not has_grad else 'present'} in the "
                    f"scheduled model but {'present' if want.grad is not None else 'missing'} in the reference"
                )
            if error is None and want.grad is not None:
                error = self._compare(f"gradient of parameter {name}", grad, want.grad)
        if error is None and matched == 0:
            error = "no parameter of the reference matched the scheduled model by name; nothing was verified"
        self._agree(error)
