"""Bytes a step holds beside its layers' activations: an element's size, and the output head's
logits and the loss's tensors (``loss_tensor_bytes``), which depend on the loss kernel and on the
stack that runs it (``DevicePerf.runtime``). Pure; ``autoslapo.cost.memory`` and
``autoslapo.cost.encdec`` add them to the layers'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoslapo.config import LOSS_CHUNK_TOKENS
from autoslapo.cost.device import is_autoslapo_runtime

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec


def element_bytes(config: ScheduleConfig) -> int:
    """Bytes of one activation element: 4 in fp32, 2 in bf16/fp16."""
    return 4 if config.precision == "fp32" else 2


def head_tensor_bytes_per_token(model: ModelSpec, config: ScheduleConfig) -> tuple[float, float]:
    """(logits, fp32 softmax of the loss): bytes of each tensor the output head keeps, per token.

    A vocab-parallel cross-entropy keeps ``V/t`` of each: Megatron's, and autoslapo's
    (``autoslapo.primitives.loss``, which every tp > 1 schedule uses for calls with labels).
    """
    cols = model.vocab / config.tp
    return cols * element_bytes(config), cols * 4.0


def head_activation_bytes_per_token(model: ModelSpec, config: ScheduleConfig) -> float:
    """Bytes the output head keeps per token: 16-bit logits and the fp32 softmax of the loss."""
    return sum(head_tensor_bytes_per_token(model, config))


# glibc's malloc serves an allocation at or above its mmap threshold with a mapping of its own, which
# free() returns to the system; the threshold rises with the chunks freed up to
# DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit systems (mallopt(3), M_MMAP_THRESHOLD). Larger tensors
# never join the heap whose retention a CPU profile measures (``DevicePerf.heap_retention``).
MMAP_THRESHOLD_MAX = 32 * 2**20


def loss_tensor_bytes(model: ModelSpec, config: ScheduleConfig, tokens: int, transients: bool = False,
                      heap: bool = False, runtime: str = "megatron") -> float:
    """Bytes the loss holds at once: the (chunk's) logits and the fp32 softmax the cross-entropy keeps
    (``head_tensor_bytes_per_token``), the chunked kernel's fp32 log-sum-exp a token, and with
    ``transients`` the fp32 gradient of the logits. ``heap``: only the tensors a CPU's allocator
    serves from its heap (each under ``MMAP_THRESHOLD_MAX``).

    A vocab-parallel loss (Megatron's; autoslapo's at tp > 1 or chunked) turns its saved softmax into
    the logits' gradient in place. At tp 1 autoslapo's runtime leaves the eager loss to the model's
    own: torch's cross-entropy over fp32 logits (transformers' causal-LM loss upcasts them; autocast
    runs ``log_softmax`` in fp32), whose backward holds three fp32 tensors of ``tokens x V`` at once:
    the saved log-softmax, its gradient (``nll_loss``'s, dense) and the logits' gradient. In 16-bit
    training the first of the three counted here is therefore fp32, not the 16-bit logits.
    """
    rows = logit_rows(model, config, tokens)
    logits, softmax = head_tensor_bytes_per_token(model, config)
    if transients and config.tp == 1 and config.loss_kernel == "eager" and is_autoslapo_runtime(runtime):
        logits = softmax  # torch's cross-entropy: three fp32 tensors in backward
    sizes = [rows * logits, rows * softmax]
    if config.loss_kernel == "chunked":
        sizes.append(tokens * 4.0)
    if transients:
        sizes.append(rows * softmax)  # the gradient of the logits, fp32 like the softmax
    return sum(x for x in sizes if not heap or x < MMAP_THRESHOLD_MAX)


def logit_rows(model: ModelSpec, config: ScheduleConfig, tokens: int) -> int:
    """Tokens whose logits the loss holds at once: all of them, or one chunk with the chunked kernel
    (which keeps an fp32 log-sum-exp per token besides, counted as one more 4-byte logit column)."""
    return min(tokens, LOSS_CHUNK_TOKENS) if config.loss_kernel == "chunked" else tokens
