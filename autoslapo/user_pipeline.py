"""Pipeline stages of a user's own module (family ``user``): its forward, cut at its blocks.

A user's forward is arbitrary Python around the loop over its blocks (``layers`` in the model
file), so a stage cannot be assembled from embed / layer / head functions as the described families'
are (``autoslapo.models.adapters``). Instead every stage runs the user's own ``forward(**batch)`` on
a *shell* of the model: a shallow copy of the modules from the root down to the block list, whose
list holds

* before the stage's range: pass-throughs (a block returns its hidden input unchanged);
* the stage's first block (not on stage 0): its hidden input replaced by the one the previous stage
  sent, the code before the loop having run again here;
* the stage's last block (not on the last stage): it runs, then raises :class:`StageDone` carrying
  its output, which ends the forward; the stage sends that hidden state on.

The last stage runs on to the loss the forward returns: its output is that loss (one value), so the
pipeline's loss function is the identity (``autoslapo.runtime.train.loss_function``).

What passes between stages is ``(hidden, *batch)``: the batch's tensors (labels too) travel with the
hidden state, so each stage reruns the code before the block loop on the same inputs (usually an
embedding lookup; its output is discarded after the first stage) and the last one computes the loss.
The shell holds the very parameter objects of the model (TP shards, checkpointing wrappers and sync
hooks included); its parameters outside the blocks sit on every stage and are found by
``autoslapo.pipeline.find_tied``, whose gradient sum gives each stage the one stage's gradient that
is not zero (the embedding's on the first, the head's on the last).

The rules this asks of a model file: the forward calls every block of ``layers`` in order, a block
takes its hidden state as its first positional argument (or its first keyword argument) and returns
it (or a tuple starting with it: a pass-through then returns ``(hidden, None, ...)``), and the code
between two blocks accepts a block's input in place of its output.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.models.adapters import PathAdapter
from autoslapo.models.user import UserModel, user_blocks, user_loss
from autoslapo.pipeline import StageModule

__all__ = ["PassThrough", "StageBlock", "StageDone", "UserStage", "block_output_arity", "build_user_stages"]


class StageDone(BaseException):
    """Raised by a non-last stage's last block to end the user's forward there; carries its output.

    A BaseException, so that a user's ``except Exception`` around its block loop does not swallow it.
    """

    def __init__(self, output: Any) -> None:
        super().__init__("pipeline stage done")
        self.output = output


def _hidden_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args:
        return args[0]
    if kwargs:
        return next(iter(kwargs.values()))
    raise ScheduleError("a pipelined block must take its hidden state as an argument: it was called with none")


def _hidden_out(out: Any, where: str) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ScheduleError(f"a pipelined block must return a tensor or a tuple starting with one: {where} returned "
                        f"{type(out).__name__}; return the hidden state first")


class PassThrough(nn.Module):
    """A block before this stage's range: returns its hidden input, in a tuple of ``arity`` (the first
    element; the others None) when the blocks return tuples (``arity`` 0: the tensor alone)."""

    def __init__(self, arity: int = 0) -> None:
        super().__init__()
        self.arity = arity

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hidden = _hidden_in(args, kwargs)
        return (hidden, *[None] * (self.arity - 1)) if self.arity else hidden


def block_output_arity(um: UserModel) -> int:
    """0 when the file's blocks return a tensor, else the length of the tuple they return: one forward
    of its model on the meta device, the first block's output looked at."""
    with torch.device("meta"):
        model = um.build()
    blocks = user_blocks(model, um)
    seen: list[Any] = []
    handle = blocks[0].register_forward_hook(lambda _m, _a, out: seen.append(out))
    batch = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in um.batch(1, 0).items()}
    try:
        model(**batch)
    finally:
        handle.remove()
    if not seen:
        raise ScheduleError(f"{um.module}.py's forward never called its first block ({um.layers}.0); "
                            "pipeline stages need the forward to run every block of layers in order")
    out = seen[0]
    return len(out) if isinstance(out, tuple | list) else 0


class StageBlock(nn.Module):
    """A block at a stage's edge: takes the received hidden state (``enter``) and/or ends the forward
    after it (``leave``). ``box[0]`` holds the received hidden state while the stage runs."""

    def __init__(self, block: nn.Module, box: list[Any], *, enter: bool, leave: bool, index: int) -> None:
        super().__init__()
        self.block = block
        self.box = box
        self.enter = enter
        self.leave = leave
        self.index = index

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.enter:
            hidden = self.box[0]
            if args:
                args = (hidden, *args[1:])
            elif kwargs:
                kwargs = {**kwargs, next(iter(kwargs)): hidden}
            else:
                raise ScheduleError(f"block {self.index} was called without its hidden state; pass it as the "
                                    "first argument")
        out = self.block(*args, **kwargs)
        if self.leave:
            raise StageDone(out)
        return out


def _shell(root: nn.Module, layers_path: str, entries: list[nn.Module]) -> nn.Module:
    """A shallow copy of ``root`` whose block list (at ``layers_path``) holds ``entries``; every module
    off that path is the model's own. The model itself is left unchanged."""
    shell = copy.copy(root)
    shell._modules = dict(root._modules)
    node, parts = shell, layers_path.split(".")
    for name in parts[:-1]:
        child = copy.copy(node._modules[name])
        assert child is not None
        child._modules = dict(child._modules)
        node._modules[name] = child
        node = child
    old = node._modules[parts[-1]]
    blocks = copy.copy(old)
    assert blocks is not None
    blocks._modules = {str(i): m for i, m in enumerate(entries)}
    node._modules[parts[-1]] = blocks
    return shell


def _off_path(root: nn.Module, layers_path: str) -> dict[str, nn.Module]:
    """The modules outside the blocks: children of the modules on the way to the block list."""
    out: dict[str, nn.Module] = {}
    node, prefix = root, ""
    for name in layers_path.split("."):
        for child, mod in node.named_children():
            if child != name:
                out[prefix + child] = mod
        node, prefix = getattr(node, name), f"{prefix}{name}."
    return out


class UserStage(StageModule):
    """One stage of a user's module: blocks ``[start, stop)`` of ``layers``, run by the user's forward.

    Takes ``(*batch)`` on the first stage and ``(hidden, *batch)`` on the others (``batch`` in the
    order of ``keys``); returns ``(hidden, *batch)``, or on the last stage the loss as a 1-element
    tensor. Its parameters are the stage's blocks and every parameter outside the blocks; ``parts``
    (a StageModule's) are the modules outside the blocks.
    """

    def __init__(self, root: nn.Module, layers_path: str, blocks: list[nn.Module], keys: tuple[str, ...], *,
                 bounds: tuple[int, int], first: bool, last: bool, arity: int = 0) -> None:
        start, stop = bounds
        super().__init__(PathAdapter(layers_path=layers_path, input_keys=keys), blocks[start:stop],
                         _off_path(root, layers_path), first=first, last=last, bounds=bounds)
        self.keys = keys
        self._box: list[Any] = [None]
        entries: list[nn.Module] = []
        for i, block in enumerate(blocks):
            if i < start or i >= stop:
                entries.append(PassThrough(arity))
            elif (i == start and not first) or (i == stop - 1 and not last):
                entries.append(StageBlock(block, self._box, enter=i == start and not first,
                                          leave=i == stop - 1 and not last, index=i))
            else:
                entries.append(block)
        # registered: its parameters are the stage's (its blocks, and the root's own parameters too)
        self.shell = _shell(root, layers_path, entries)

    def forward(self, *inputs: torch.Tensor) -> Any:
        hidden, batch = (None, inputs) if self.first else (inputs[0], inputs[1:])
        if len(batch) != len(self.keys):
            raise ScheduleError(f"stage {self.bounds} takes the batch's {len(self.keys)} tensors "
                                f"({', '.join(self.keys)}): got {len(batch)}")
        self._box[0] = hidden
        try:
            out = self.shell(**dict(zip(self.keys, batch, strict=True)))
        except StageDone as done:
            if self.last:
                raise ScheduleError("the last stage ended before the loss") from None
            return (_hidden_out(done.output, f"block {self.bounds[1] - 1}"), *batch)
        finally:
            self._box[0] = None
        if not self.last:
            raise ScheduleError(f"the forward returned before block {self.bounds[1] - 1}, where stage "
                                f"{self.bounds} ends; the forward must call every block of layers in order")
        return user_loss(out).reshape(1)



def build_user_stages(root: nn.Module, layers_path: str, bounds: list[tuple[int, int]],
                      keys: tuple[str, ...], arity: int = 0) -> tuple[list[UserStage], PathAdapter]:
    """Every stage of a user's module, in order, and the adapter naming its layer list and input keys.

    Takes: the (scheduled, materialized) model, the dotted path of its block list, each stage's
    ``[start, stop)``, the batch keys in the order the stages take them and what a block returns
    (``block_output_arity``).
    Raises: ScheduleError when ``layers_path`` is not a ModuleList / nn.Sequential of the model.
    """
    try:
        blocks_mod = root.get_submodule(layers_path)
    except AttributeError as exc:
        raise ScheduleError(f"layers {layers_path!r} is not a submodule of {type(root).__name__}") from exc
    if not isinstance(blocks_mod, nn.ModuleList | nn.Sequential):
        raise ScheduleError(f"layers must name a ModuleList or nn.Sequential to pipeline: {layers_path!r} is a "
                            f"{type(blocks_mod).__name__}")
    blocks = list(blocks_mod)
    n = len(bounds)
    stages = [UserStage(root, layers_path, blocks, keys, bounds=b, first=i == 0, last=i == n - 1, arity=arity)
              for i, b in enumerate(bounds)]
    return stages, PathAdapter(layers_path=layers_path, input_keys=keys)
