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

What the software stack adds is kept apart by ``DevicePerf.runtime``: ``"megatron"`` is the layout
of the published runs; ``"autoslapo"`` (on a CPU) and ``"autoslapo-gpu"`` are autoslapo's runtime
(fp32 parameters under autocast, the transformers modules' extra saved tensors, DeepSpeed's buffers
touched lazily on a CPU, held whole on a GPU). See ``state_bytes_per_param``,
``layer_activation_bytes_per_token`` and ``zero_buffer_bytes``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from autoslapo import layout
from autoslapo.cost.device import AUTOSLAPO_CPU, is_autoslapo_runtime
from autoslapo.cost.encdec import encdec_activation_bytes, encdec_stage_params
from autoslapo.cost.head import element_bytes, loss_tensor_bytes
from autoslapo.cost.kernels import rms_norm_saved_extra
from autoslapo.models.spec import family_flag, is_convolutional
from autoslapo.models.wrn_shape import wrn_rank_params

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
    buffers: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.overhead + self.buffers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total"] = self.total
        return d


def state_bytes_per_param(config: ScheduleConfig, runtime: str = "megatron") -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter before ZeRO partitioning (Adam/LAMB).

    fp32 with ZeRO >= 1: DeepSpeed's ZeRO optimizer keeps its own fp32 partition of the weights
    (``single_partition_of_fp32_groups``, a clone even when the model is fp32), so 4 + 8.
    autoslapo's runtime (``is_autoslapo_runtime``): the parameters and gradients stay fp32 whatever
    the precision (16-bit is autocast's compute only), so 4 + 4 + 8, plus DeepSpeed's fp32 partition
    with ZeRO >= 1 when its engine runs (pp == 1); a pipeline's ``ZeroRedundancyOptimizer`` keeps no
    such copy.
    """
    if is_autoslapo_runtime(runtime):
        return 4, 4, (12 if config.zero_stage >= 1 and config.pp == 1 else 8)
    if config.precision == "fp32":
        return 4, 4, (12 if config.zero_stage >= 1 else 8)
    return 2, 2, 12


def stage_params(model: ModelSpec, config: ScheduleConfig) -> tuple[float, float]:
    """Parameters on one device of (the first, the last) pipeline stage, after TP sharding; where an
    uneven split gives a middle stage more (its extra layers outweigh the embeddings), that stage's
    stand for the first's.

    Embeddings are vocab-parallel over TP (Megatron); with pp > 1 the last stage keeps its own copy
    of tied word embeddings for the logits; LLaMA's untied head is always on the last stage. A
    shared layer (ALBERT) is on every stage.
    """
    if model.encoder_decoder:  # T5: two unequal stacks (``autoslapo.cost.encdec``)
        return encdec_stage_params(model, config)
    if is_convolutional(model.family):  # WideResNet: only the bottlenecks' conv1/bn1/conv2 split over tp
        chunks = config.pp * config.virtual_stages
        ranks = wrn_rank_params(model.hidden, model.ffn, model.layers, model.vocab, tp=config.tp, pp=config.pp,
                                chunks=chunks)
        return ranks[0], ranks[(chunks - 1) % config.pp]
    # a shared layer (ALBERT) is stored once however often it runs, and whole on every pipeline
    # stage (each runs some of its calls; ``estimate_time`` sums its gradients over the stages)
    per_rank = ([model.stored_layers] * config.pp if model.shared_layers
                else [len(r) for r in layout.rank_layers(model.layers, config.pp, config.virtual_stages)])
    body = [n * model.layer_params() / config.tp for n in per_rank]
    emb = model.embedding_params() / config.tp
    word = model.vocab * model.embedding_size / config.tp
    head = word if (not model.tied_head or config.pp > 1) else 0.0
    if config.pp == 1:
        return body[0] + emb + head, body[0] + emb + head
    return max([body[0] + emb, *body[1:-1]]), body[-1] + head


def estimate_state_bytes(model: ModelSpec, config: ScheduleConfig,
                         runtime: str = "megatron") -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes on the most loaded device, ZeRO applied."""
    n = max(stage_params(model, config))
    w, g, o = state_bytes_per_param(config, runtime)
    dp = config.dp
    z = config.zero_stage
    return (
        int(n * w / (dp if z >= 3 else 1)),
        int(n * g / (dp if z >= 2 else 1)),
        int(n * o / (dp if z >= 1 else 1)),
    )


def has_dropout(model: ModelSpec, dropout: bool | None) -> bool:
    """Whether training applies dropout: as given, else the family's ``dropout`` flag (LLaMA has none).

    With dropout off, PyTorch's dropout returns its input and stores no mask.
    """
    return family_flag(model.family, "dropout") if dropout is None else dropout


#: Families whose MLP runs transformers' tanh-GELU (``gelu_new``, a chain of elementwise ops).
TANH_GELU_FAMILIES = ("gpt2", "gpt_neo", "albert")


def mlp_saved_elements(model: ModelSpec, config: ScheduleConfig, runtime: str = "megatron") -> int:
    """Elements of width ``ffn`` (before TP) the MLP keeps for backward, per token.

    Gated (SwiGLU): gate and up outputs, the activation and the product (4); with Megatron's fused
    kernels (``compile_layers`` on the GPU stacks) its SwiGLU function saves only its input, gate and
    up, and recomputes the activation in backward (``megatron/core/fusions/fused_bias_swiglu.py``),
    so the product, the down projection's input, is the third (3). GELU (BERT/RoBERTa,
    ``F.gelu``): its input and fc2's input (2). ReLU (OPT): its output is fc2's input (1). GPT-2's
    tanh-GELU is written in transformers as a chain of elementwise ops, and autograd keeps three
    more intermediates of that width unless the layer is fused (``fuse_bias_gelu``/compiled) (5).
    """
    if model.gated_mlp:
        return 3 if config.compile_layers and not is_autoslapo_runtime(runtime) else 4
    if model.family == "opt":
        return 1
    if model.family in TANH_GELU_FAMILIES and not (config.fuse_bias_gelu or config.compile_layers):
        return 5
    return 2


def layer_activation_bytes_per_token(model: ModelSpec, config: ScheduleConfig,
                                     dropout: bool | None = None, runtime: str = "megatron") -> float:
    """Bytes one non-checkpointed layer stores per token, on one device (Korthikanti's terms).

    autoslapo's runtime (transformers modules, ``is_autoslapo_runtime``) differs in what the
    code keeps: LayerNorm runs in fp32 under autocast, so each norm keeps its fp32 input and the
    16-bit cast of its output that the next projection saves (``2 (4 + e) h``); the sdpa/flash
    kernel's output is saved for its backward *and* copied by the heads' merge (``transpose +
    reshape``) that the out-projection saves (``+h/t``); autocast's softmax of eager attention keeps
    fp32 probabilities and their 16-bit cast.
    """
    e = element_bytes(config)
    t = config.tp
    h, f = model.hidden, model.ffn
    kvd = model.kv_heads * model.head_dim
    dropout = has_dropout(model, dropout)
    ours = is_autoslapo_runtime(runtime)
    # Replicated over TP unless sequence-parallel: two norm inputs, the q/k/v and fc1 inputs
    # (norm outputs), and the two 1-byte dropout masks.
    norms: float = 2 * h * (4 + e) if ours else 4 * h * e
    norms += 2 * h * rms_norm_saved_extra(model.family, e, config.norm_kernel, config.compile_layers, ours)
    replicated: float = norms + (2 * h if dropout else 0)
    # Sharded over TP: q, k, v, the attention output (out-proj input), the MLP's inner tensors.
    mlp = mlp_saved_elements(model, config, runtime) * f * e
    sharded = (h + 2 * kvd + h) * e + mlp
    if config.attn_kernel == "eager":
        # softmax output, dropout mask (1 byte) and dropout output per score: 5 a s in 16-bit
        probs = e + 4 if ours and e < 4 else e
        per_score = (probs + e + 1) if dropout else probs
        sharded += model.heads * model.seq_len * per_score
    else:
        sharded += model.heads * 4  # memory-efficient kernels keep a log-sum-exp per row
        if ours:
            sharded += h * e  # the kernel's output, saved for its backward besides the merged copy
    if config.sequence_parallel:
        replicated /= t
    return replicated + sharded / t


def attention_core_bytes_per_token(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None,
                                   runtime: str = "megatron") -> float:
    """Bytes of a layer's activations (per token, one device) that only its attention core keeps:
    the ``5 a s`` of the scores (softmax, dropout mask and output) with the eager kernel, the
    log-sum-exp (and, in autoslapo's runtime, the kernel's output) with a memory-efficient one."""
    e = element_bytes(config)
    if config.attn_kernel == "eager":
        probs = e + 4 if is_autoslapo_runtime(runtime) and e < 4 else e
        per_score = (probs + e + 1) if has_dropout(model, dropout) else probs
        return model.heads * model.seq_len * per_score / config.tp
    core = model.heads * 4 + (model.hidden * e if is_autoslapo_runtime(runtime) else 0)
    return core / config.tp


def layer_linears(model: ModelSpec) -> list[tuple[int, int, bool]]:
    """The weight products of one layer in the order its forward runs them: ``(out, in, row_parallel)``
    features before TP. q, k, v (GPT-2: one fused c_attn), the attention's output projection, then
    the MLP (gated: gate, up, down; else fc1, fc2). A row-parallel product's output is the whole
    ``out`` on every TP rank (a partial sum before its all-reduce); a column-parallel one's ``out/t``."""
    h, f, kvd = model.hidden, model.ffn, model.kv_heads * model.head_dim
    attn = [(h + 2 * kvd, h, False)] if model.family == "gpt2" else [(h, h, False), (kvd, h, False), (kvd, h, False)]
    attn.append((h, h, True))
    mlp = [(f, h, False), (f, h, False), (h, f, True)] if model.gated_mlp else [(f, h, False), (h, f, True)]
    return attn + mlp


def op_kept_linears(model: ModelSpec) -> list[tuple[int, int, bool]]:
    """The products whose outputs per-op recomputation keeps: the 1st, 3rd, ... of ``layer_linears``
    (``autoslapo.primitives.checkpoint``, ``keep="alternate"``); the others are recomputed."""
    return layer_linears(model)[::2]


def op_kept_bytes_per_token(model: ModelSpec, config: ScheduleConfig) -> float:
    """Bytes a layer checkpointed per op keeps per token on one device besides its input: every other
    linear output and, with a fused attention kernel, its output and log-sum-exp (an eager attention
    core is recomputed whole)."""
    e, t = element_bytes(config), config.tp
    kept = sum(out * e / (1 if row else t) for out, _, row in op_kept_linears(model))
    if config.attn_kernel != "eager":
        kept += (model.hidden * e + model.heads * 4) / t
    return kept


def checkpointed_layer_bytes_per_token(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None,
                                       runtime: str = "megatron") -> float:
    """Bytes a checkpointed layer keeps per token: its input (``/t`` with sequence parallelism) under
    full recomputation; under selective recomputation everything but its attention core (Korthikanti
    et al. 2022: ``34 s b h`` of the ``s b h (34 + 5 a s / h)`` bytes of a 16-bit layer); per op,
    its input and what ``op_kept_bytes_per_token`` counts."""
    if config.ckpt_granularity == "selective":
        return (layer_activation_bytes_per_token(model, config, dropout, runtime)
                - attention_core_bytes_per_token(model, config, dropout, runtime))
    b: float = model.hidden * element_bytes(config)
    b = b / config.tp if config.sequence_parallel else b
    return b + (op_kept_bytes_per_token(model, config) if config.ckpt_granularity == "op" else 0.0)


def checkpointed_layer_ids(model: ModelSpec, config: ScheduleConfig) -> list[int]:
    """Layers the schedule checkpoints: the ratio applies within each pipeline chunk, as
    ``autoslapo.plan.checkpointed_layers`` does (so every stage holds about the same). T5's blocks of
    both stacks: ``autoslapo.cost.encdec.checkpointed_blocks``."""
    chunks = config.pp * config.virtual_stages
    if chunks > min(layout.max_chunks(model), model.layers + 2):  # no such split (``layout.pp_problem``)
        return list(config.checkpointed_layers(model.layers))  # the ratio over the whole model
    return [a + i for a, b in layout.chunk_bounds(model.layers, chunks) for i in config.checkpointed_layers(b - a)]


def in_flight_microbatches(config: ScheduleConfig, rank: int = 0) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` (the first by default) holds at its peak.

    1F1B: rank r runs ``pp - r`` forwards before its first backward. Interleaved (Megatron's warm-up):
    ``2 (pp - r - 1) + (v - 1) pp`` chunk forwards and the one in flight, each a ``1/v`` of the rank's
    layers. GPipe: every micro-batch.
    """
    m, p, v = config.grad_accum, config.pp, config.virtual_stages
    if p == 1:
        return 1.0
    if config.pipeline_schedule == "gpipe":
        return float(m)
    if config.pipeline_schedule == "interleaved":
        return min(float(m), p + (p - 2 * rank - 1) / v)
    return float(min(m, p - rank))


def estimate_activation_bytes(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None,
                              runtime: str = "megatron", transients: bool = False, heap: bool = False) -> int:
    """Peak activation bytes on the most loaded device (first or last pipeline stage).

    ``transients=False``: the tensors saved for backward (Korthikanti's accounting). ``True``: the
    peak a memory counter sees, which adds what backward holds besides them: the gradients of the
    layer it is in (about that layer's activations again) and, at the loss, the fp32 gradient of
    the logits. ``heap``: the loss's tensors only where a CPU allocator's heap holds them
    (``loss_tensor_bytes``).
    """
    if model.encoder_decoder:  # T5: source and target tokens, two kinds of block
        return encdec_activation_bytes(model, config, dropout, runtime, transients, in_flight_microbatches(config),
                                       heap=heap)
    tokens = config.micro_batch * model.seq_len
    full = layer_activation_bytes_per_token(model, config, dropout, runtime) * tokens
    kept = checkpointed_layer_bytes_per_token(model, config, dropout, runtime) * tokens
    ranks = layout.rank_layers(model.layers, config.pp, config.virtual_stages)
    ckpt = set(checkpointed_layer_ids(model, config))
    e = element_bytes(config)
    grads = full if transients else 0.0

    def stage(layers: list[int], microbatches: float) -> tuple[float, float]:
        """(end of forward, peak in backward) of a rank running ``layers`` with ``microbatches`` in flight."""
        stored = [kept if i in ckpt else full for i in layers]
        total = sum(stored)
        # Backward runs the layers in reverse, freeing each once done; at layer j the layers before
        # it still hold theirs, j holds its full activations (rebuilt if it was checkpointed) and
        # the gradients flowing through it. Other in-flight micro-batches keep everything stored.
        peak, prefix = total, 0.0
        for size in stored:
            peak = max(peak, prefix + full + grads)
            prefix += size
        return microbatches * total, (microbatches - 1) * total + peak

    # Embedding output and its dropout mask on the first stage; on the last the head's logits
    # (16-bit, plus the fp32 softmax the cross-entropy keeps), freed once the loss's backward ran.
    emb = tokens * model.hidden * (e + (1 if has_dropout(model, dropout) else 0))
    logits = loss_tensor_bytes(model, config, tokens, transients, heap, runtime)
    # the final norm's chain (an eager RMSNorm) is held with the logits, until the head's backward ran
    logits += tokens * model.hidden * rms_norm_saved_extra(model.family, e, config.norm_kernel, config.compile_layers,
                                                           is_autoslapo_runtime(runtime))
    fwd_first, bwd_first = stage(ranks[0], in_flight_microbatches(config))
    if config.pp == 1:
        return int(max(fwd_first + logits, bwd_first) + emb)
    fwd_last, bwd_last = stage(ranks[-1], 1.0)
    # a middle rank holds fewer micro-batches than the first and neither embedding nor logits: it
    # peaks higher only where an uneven split gives it more layers
    uneven = model.layers % (config.pp * config.virtual_stages) != 0
    middle = (max(stage(ranks[r], in_flight_microbatches(config, r))) for r in range(1, config.pp - 1) if uneven)
    return int(max(max(fwd_first, bwd_first) + emb, fwd_last + logits, bwd_last, *middle))


# DeepSpeed's default ``reduce_bucket_size`` (elements), ``deepspeed/runtime/zero/config.py``.
REDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed's default ``stage3_prefetch_bucket_size`` (elements).
PREFETCH_BUCKET_ELEMENTS = 50_000_000


def zero_buffer_bytes(model: ModelSpec, config: ScheduleConfig, runtime: str = "megatron") -> tuple[int, int]:
    """(during backward, after backward) bytes of DeepSpeed's gradient buffers on one device.

    ZeRO-1/2 (``stage_1_and_2.py``): with ``contiguous_gradients`` (the default) each backward
    copies the gradients into an ``ipg`` bucket of ``reduce_bucket_size`` elements
    (``torch.empty``) before reducing them; the gradient partition then lives in
    ``grads_in_partition`` (ZeRO-2, counted as the gradients) or, at the step, an fp32
    ``single_grad_partition`` (ZeRO-1). On a GPU the caching allocator holds the whole bucket; on a
    CPU only the pages the copy touches count: ``min(bucket, N)`` elements. ZeRO-0 under DeepSpeed's
    engine all-reduces flattened copies of the gradients after backward (Megatron's contiguous
    gradient buffer *is* the gradients, so the ``megatron`` runtime adds nothing there). A
    pipeline (pp > 1) averages gradients in flat per-dtype copies after its schedule, except under
    ZeRO-2, which reduces them to their owners a parameter at a time in backward. ZeRO-3 adds
    the gathered weights in use and in prefetch.
    """
    n = max(stage_params(model, config))
    g = state_bytes_per_param(config, runtime)[1]
    ours = is_autoslapo_runtime(runtime)
    if config.dp == 1 and config.zero_stage == 0:
        return 0, 0
    if config.pp > 1 and config.zero_stage == 2:
        # each micro-batch's gradients go to their owners a parameter at a time (GradientOwners)
        return 0, 0
    if config.pp > 1 or config.zero_stage == 0:
        return 0, int(n * g) if ours else 0
    bucket = min(REDUCE_BUCKET_ELEMENTS, n) if runtime == AUTOSLAPO_CPU else REDUCE_BUCKET_ELEMENTS
    if config.zero_stage in (1, 2):
        after = int(n * 4 / config.dp) if config.zero_stage == 1 else 0
        return int(bucket * g), after
    # ZeRO-3 (stage3.py): the same reduce bucket, plus the gathered weights of the layer being
    # computed and the next ones its prefetch bucket (``stage3_prefetch_bucket_size``) fetches
    w = state_bytes_per_param(config, runtime)[0]
    gathered = model.layer_params() / config.tp + min(PREFETCH_BUCKET_ELEMENTS, n)
    return int(bucket * g + gathered * w), 0


def estimate_memory(model: ModelSpec, config: ScheduleConfig, perf: DevicePerf,
                    dropout: bool | None = None) -> MemoryBreakdown:
    """Per-device memory of ``config``: model states, activations, buffers and the framework's overhead.

    Buffers that live only after backward (when the activations are freed) count only where they
    exceed the activations.
    """
    if model.family == "user":
        return estimate_user_memory(model, config, perf)
    rt = perf.runtime
    w, g, o = estimate_state_bytes(model, config, rt)
    if is_autoslapo_runtime(rt) and config.precision != "fp32":
        # autocast caches a 16-bit copy of every weight it casts, kept until backward used it
        w += int(max(stage_params(model, config)) * element_bytes(config))
    act = int(estimate_activation_bytes(model, config, dropout, rt, transients=True) * perf.activation_slack)
    if perf.heap_retention:
        # the host allocator's heap keeps what every layer's full activations occupied (see DevicePerf),
        # an RMSNorm's chain included: a one-op norm runs it too and frees it, as recomputation does
        full = replace(config, ckpt_ratio=0.0, norm_kernel="eager")
        act += int(estimate_activation_bytes(model, full, dropout, rt, transients=True, heap=True) * perf.heap_retention)
    during, after = zero_buffer_bytes(model, config, rt)
    buffers = during + max(0, after - act)
    if config.zero_stage >= 1 and config.pp == 1:  # DeepSpeed's ZeRO optimizer (pipelines use torch's)
        buffers += perf.zero_overhead_bytes
    return MemoryBreakdown(params=w, grads=g, optimizer=o, activations=act,
                           overhead=perf.fixed_overhead_bytes, buffers=buffers)


def estimate_user_memory(model: ModelSpec, config: ScheduleConfig, perf: DevicePerf) -> MemoryBreakdown:
    """Per-device memory of a user's own module (family ``user``) from its traced shape (``model.extra``).

    Parameters: the blocks' sharded over tp (the file's family description), the rest on every
    rank; states and ZeRO as for the families. Activations: the fp32 bytes the trace saw saved per
    sample, scaled to the precision's element size; a block's share under tp as Korthikanti's
    ``(10 + 24/t) / 34``; a checkpointed block keeps its input (selective recomputation: all but
    what its attention module saves beyond its input and weight products); backward holds one block's
    activations more while it runs it. Pipeline stages (``autoslapo.user_pipeline``) split the
    blocks; the parameters outside them sit on every stage; the first stage keeps its blocks'
    activations of every micro-batch in flight, the last one micro-batch's and those outside the
    blocks (the trace's ``act_bytes``: the first stage keeps them too, for its in-flight micro-batches).
    """
    x, rt = model.extra, perf.runtime
    ranks = (layout.rank_layers(model.layers, config.pp, config.virtual_stages) if x.get("layers")
             else [[] for _ in range(config.pp)])
    n = max(len(r) for r in ranks) * model.layer_params() / config.tp + model.embedding_params()
    wb, gb, ob = state_bytes_per_param(config, rt)
    dp, z = config.dp, config.zero_stage
    w = n * wb / (dp if z >= 3 else 1)
    g = n * gb / (dp if z >= 2 else 1)
    o = n * ob / (dp if z >= 1 else 1)
    if is_autoslapo_runtime(rt) and config.precision != "fp32":
        w += n * element_bytes(config)  # autocast's 16-bit weight copies
    scale = element_bytes(config) / 4
    layer = float(x["layer_act_bytes"]) * scale * (10 + 24 / config.tp) / 34
    kept = float(x["layer_input_bytes"]) * scale
    if config.ckpt_granularity == "selective":
        # the block less what its attention module saves, plus what selective recomputation keeps of
        # it (its input, its products with weights): traced, the attention's share sharded over tp
        kept = layer - (float(x["attn_act_bytes"]) - float(x["attn_kept_bytes"])) * scale / config.tp
    ckpt = set(checkpointed_layer_ids(model, config)) if x.get("layers") else set()

    def per_stage_bytes(with_ckpt: bool) -> float:
        # per micro-batch: a rank's blocks (checkpointed ones keep their input) and the rest, times the
        # micro-batches it holds (the first rank the most; an uneven split may give another more blocks)
        def stored(r: int) -> float:
            c = sum(1 for i in ranks[r] if i in ckpt) if with_ckpt else 0
            return (len(ranks[r]) - c) * layer + c * kept + float(x["act_bytes"]) * scale
        peak = max(max(in_flight_microbatches(config, r) * stored(r), stored(r)) for r in range(config.pp))
        return peak * config.micro_batch + layer * config.micro_batch

    act = int(per_stage_bytes(True) * perf.activation_slack)
    if perf.heap_retention:
        act += int(per_stage_bytes(False) * perf.heap_retention)
    buffers = 0
    if dp > 1 or z > 0:
        bucket = min(REDUCE_BUCKET_ELEMENTS, n) if rt == AUTOSLAPO_CPU else REDUCE_BUCKET_ELEMENTS
        if z == 0:
            buffers = max(0, int(n * gb) - act) if is_autoslapo_runtime(rt) else 0
        else:
            buffers = int(bucket * gb) + (int(n * 4 / dp) if z == 1 else 0)
            if z == 3:
                buffers += int((model.layer_params() / config.tp + min(PREFETCH_BUCKET_ELEMENTS, n)) * wb)
            buffers += perf.zero_overhead_bytes
    return MemoryBreakdown(params=int(w), grads=int(g), optimizer=int(o), activations=act,
                           overhead=perf.fixed_overhead_bytes, buffers=buffers)
