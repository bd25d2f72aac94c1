"""Per-device memory of a schedule: model states under ZeRO, activations, overhead. Pure.

Model states (Rajbhandari et al., "ZeRO", SC'20, section 3.1): mixed-precision Adam keeps 2 bytes
of 16-bit weights, 2 of gradients and K = 12 of optimizer state (fp32 master weights, momentum,
variance) per parameter; fp32 training keeps 4 + 4 + 8. ZeRO-1 partitions the optimizer state
over the data-parallel group, ZeRO-2 the gradients too, ZeRO-3 the weights too.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
2022, section 4): one layer stores ``s b h (34 + 5 a s / h)`` bytes in 16-bit training; with
tensor parallelism of degree t, ``s b h (10 + 24/t + 5 a s/(h t))``; with sequence parallelism
``s b h (34/t + 5 a s/(h t))``; a fully recomputed layer keeps only its input, ``2 s b h``
(``/t`` with sequence parallelism). The first pipeline stage of 1F1B holds ``pp`` micro-batches in
flight; GPipe holds all of them; the interleaved schedule ``pp (1 + (pp-1)/(pp v))`` (section
4.2.3). The terms are written per tensor below so they hold for other MLP widths, gated MLPs,
grouped-query attention, fp32 and memory-efficient (flash) attention, which stores no ``s x s``
matrix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.device import DevicePerf
    from autoslapo.models.spec import ModelSpec


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device on the most loaded pipeline stage."""

    params: int
    grads: int
    optimizer: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.overhead

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total"] = self.total
        return d


def element_bytes(config: ScheduleConfig) -> int:
    """Bytes of one activation element: 4 in fp32, 2 in bf16/fp16."""
    return 4 if config.precision == "fp32" else 2


def state_bytes_per_param(config: ScheduleConfig) -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter before ZeRO partitioning (Adam/LAMB).

    fp32 with ZeRO >= 1: DeepSpeed's ZeRO optimizer keeps its own fp32 partition of the weights
    (``single_partition_of_fp32_groups``, a clone even when the model is fp32), so 4 + 8.
    """
    if config.precision == "fp32":
        return 4, 4, (12 if config.zero_stage >= 1 else 8)
    return 2, 2, 12


def stage_params(model: ModelSpec, config: ScheduleConfig) -> tuple[float, float]:
    """Parameters on one device of (the first, the last) pipeline stage, after TP sharding.

    Embeddings are vocab-parallel over TP (Megatron); with pp > 1 the last stage keeps its own copy
    of tied word embeddings for the logits; LLaMA's untied head is always on the last stage.
    """
    layers = model.layers / config.pp
    body = layers * model.layer_params() / config.tp
    emb = model.embedding_params() / config.tp
    word = model.vocab * model.hidden / config.tp
    head = word if (model.family == "llama" or config.pp > 1) else 0.0
    if config.pp == 1:
        return body + emb + head, body + emb + head
    return body + emb, body + head


def estimate_state_bytes(model: ModelSpec, config: ScheduleConfig) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes on the most loaded device, ZeRO applied."""
    n = max(stage_params(model, config))
    w, g, o = state_bytes_per_param(config)
    dp = config.dp
    z = config.zero_stage
    return (
        int(n * w / (dp if z >= 3 else 1)),
        int(n * g / (dp if z >= 2 else 1)),
        int(n * o / (dp if z >= 1 else 1)),
    )


def has_dropout(model: ModelSpec, dropout: bool | None) -> bool:
    """Whether training applies dropout: as given, else the family's default (LLaMA has none).

    With dropout off, PyTorch's dropout returns its input and stores no mask.
    """
    return model.family != "llama" if dropout is None else dropout


def mlp_saved_elements(model: ModelSpec, config: ScheduleConfig) -> int:
    """Elements of width ``ffn`` (before TP) the MLP keeps for backward, per token.

    Gated (SwiGLU): gate and up outputs, the activation and the product (4). GELU (BERT/RoBERTa,
    ``F.gelu``): its input and fc2's input (2). ReLU (OPT): its output is fc2's input (1). GPT-2's
    tanh-GELU is written in transformers as a chain of elementwise ops, and autograd keeps three
    more intermediates of that width unless the layer is fused (``fuse_bias_gelu``/compiled) (5).
    """
    if model.gated_mlp:
        return 4
    if model.family == "opt":
        return 1
    if model.family == "gpt2" and not (config.fuse_bias_gelu or config.compile_layers):
        return 5
    return 2


def layer_activation_bytes_per_token(model: ModelSpec, config: ScheduleConfig,
                                     dropout: bool | None = None) -> float:
    """Bytes one non-checkpointed layer stores per token, on one device (Korthikanti's terms)."""
    e = element_bytes(config)
    t = config.tp
    h, f = model.hidden, model.ffn
    kvd = model.kv_heads * model.head_dim
    dropout = has_dropout(model, dropout)
    # Replicated over TP unless sequence-parallel: two norm inputs, the q/k/v and fc1 inputs
    # (norm outputs), and the two 1-byte dropout masks.
    replicated: float = 4 * h * e + (2 * h if dropout else 0)
    # Sharded over TP: q, k, v, the attention output (out-proj input), the MLP's inner tensors.
    mlp = mlp_saved_elements(model, config) * f * e
    sharded = (h + 2 * kvd + h) * e + mlp
    if config.attn_kernel == "eager":
        # softmax output, dropout mask (1 byte) and dropout output per score: 5 a s in 16-bit
        per_score = (2 * e + 1) if dropout else e
        sharded += model.heads * model.seq_len * per_score
    else:
        sharded += model.heads * 4  # memory-efficient kernels keep a log-sum-exp per row
    if config.sequence_parallel:
        replicated /= t
    return replicated + sharded / t


def checkpointed_layer_bytes_per_token(model: ModelSpec, config: ScheduleConfig) -> float:
    """Bytes a checkpointed layer keeps per token: its input (``/t`` with sequence parallelism)."""
    b = model.hidden * element_bytes(config)
    return b / config.tp if config.sequence_parallel else b


def in_flight_microbatches(config: ScheduleConfig) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    m, p = config.grad_accum, config.pp
    if p == 1:
        return 1.0
    if config.pipeline_schedule == "gpipe":
        return float(m)
    if config.pipeline_schedule == "interleaved":
        return min(float(m), p * (1 + (p - 1) / (p * config.virtual_stages)))
    return float(min(m, p))


def estimate_activation_bytes(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None) -> int:
    """Peak activation bytes on the most loaded device (first or last pipeline stage)."""
    tokens = config.micro_batch * model.seq_len
    full = layer_activation_bytes_per_token(model, config, dropout) * tokens
    kept = checkpointed_layer_bytes_per_token(model, config) * tokens
    per_stage = model.layers // config.pp
    ckpt = set(config.checkpointed_layers(model.layers))
    e = element_bytes(config)

    def stage(first_layer: int, microbatches: float) -> float:
        is_ckpt = [i in ckpt for i in range(first_layer, first_layer + per_stage)]
        stored = [kept if c else full for c in is_ckpt]
        total = sum(stored)
        # Backward runs the layers in reverse, freeing each once done; recomputing checkpointed
        # layer j rebuilds its full activations (its kept input among them) while the layers
        # before it still hold theirs. The peak is the larger of that and the end of forward;
        # other in-flight micro-batches keep everything stored meanwhile.
        peak, prefix = total, 0.0
        for j, size in enumerate(stored):
            if is_ckpt[j]:
                peak = max(peak, prefix + full)
            prefix += size
        return (microbatches - 1) * total + peak

    # Embedding output and its dropout mask on the first stage; logits (16-bit, plus the fp32
    # softmax the cross-entropy keeps) on the last, vocab-parallel over TP.
    emb = tokens * model.hidden * (e + (1 if has_dropout(model, dropout) else 0))
    logits = tokens * model.vocab / config.tp * (e + 4)
    first = stage(0, in_flight_microbatches(config)) + emb
    last = stage(model.layers - per_stage, 1.0) + logits
    if config.pp == 1:
        return int(first + logits)
    return int(max(first, last))


def estimate_memory(model: ModelSpec, config: ScheduleConfig, perf: DevicePerf,
                    dropout: bool | None = None) -> MemoryBreakdown:
    """Per-device memory of ``config``: model states, activations and the framework's overhead."""
    w, g, o = estimate_state_bytes(model, config)
    act = estimate_activation_bytes(model, config, dropout) * perf.activation_slack
    return MemoryBreakdown(params=w, grads=g, optimizer=o, activations=int(act),
                           overhead=perf.fixed_overhead_bytes)
