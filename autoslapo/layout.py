"""The layout of a training step on a cluster: degrees, batch, placement, and every rule tying them.

One module states the rules (torchtitan's ``ParallelDims`` idea; ``ScheduleConfig`` holds the degrees
and derives ``world_size`` and ``global_batch``): tp x pp x dp = the devices; tp
divides the attention heads, the key/value heads and the MLP width, and stays within a node; the
pipeline's chunks (pp x virtual stages) split the layers (an encoder-decoder's blocks, both stacks in
one list) as evenly as they can, each holding at least one but a transformer's first and last;
micro-batch x dp x gradient accumulation = the global batch; sequence parallelism splits the
sequence over tp. The config's validation, the search spaces, the cost model's sweep, the tuner,
the baselines and the CLI all ask here. One rule, too, for the default precision.

Pure: no torch, no I/O. Messages name the rule, the values and the fix.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING

from autoslapo.errors import ConfigError
from autoslapo.models.spec import is_convolutional

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.knobs import Knob
    from autoslapo.models.spec import ModelSpec


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def data_parallel(gpus: int, tp: int, pp: int) -> int:
    """dp for ``tp`` and ``pp`` on ``gpus`` devices. Raises ConfigError unless tp*pp divides them."""
    if tp < 1 or pp < 1 or gpus % (tp * pp):
        raise ConfigError(
            f"tp*pp must divide --gpus: got tp={tp}, pp={pp} ({tp * pp}) for --gpus {gpus}; "
            f"pick degrees whose product divides {gpus}"
        )
    return gpus // (tp * pp)


#: The largest global batch a step may take: 2**24 sequences (published LLM batches are a few thousand).
MAX_GLOBAL_BATCH = 2**24


def check_global_batch(global_batch: object) -> None:
    """Raise ConfigError unless ``global_batch`` is a whole number of sequences from 1 to ``MAX_GLOBAL_BATCH``."""
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise ConfigError(f"--global-batch must be a positive integer: got {global_batch!r}; pass the sequences a "
                          "step, or leave it out")
    if global_batch > MAX_GLOBAL_BATCH:
        raise ConfigError(f"--global-batch must be at most {MAX_GLOBAL_BATCH:,} sequences a step (2**24; published "
                          f"batches are a few thousand): got {global_batch:,}; give a smaller one")


def grad_accum_for(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per replica and step. Raises ConfigError unless micro_batch*dp divides the global batch."""
    if global_batch % (micro_batch * dp):
        raise ConfigError(
            f"micro_batch*dp must divide the global batch: got {micro_batch}*{dp} for {global_batch}; "
            f"use a global batch that is a multiple of {micro_batch * dp}"
        )
    return global_batch // (micro_batch * dp)


def tp_problem(tp: int, model: ModelSpec, cluster: ClusterSpec | None = None) -> str:
    """Why ``tp`` cannot shard ``model`` (on ``cluster``), or "" when it can."""
    if model.family == "user" and tp > 1 and not model.extra.get("tp"):
        return (f"tensor parallelism needs the model file to declare family: got tp={tp} for {model.preset}.py; "
                "add family = autoslapo.FamilyDescription(...) (or shard_block) to it or use tp=1")
    if model.family == "user" and tp > 1 and model.extra.get("tp_problem"):
        return f"got tp={tp} for {model.preset}.py: {model.extra['tp_problem']}"
    if model.family == "user" and model.heads % tp:
        return (f"tp must divide every size the schedule shards (heads, projection widths): got tp={tp} for "
                f"{model.preset}.py, whose sizes share the divisor {model.heads}; use a tp that divides {model.heads}")
    if is_convolutional(model.family):
        # tp splits each bottleneck's width (conv1's outputs, conv2's inputs); later stages double it
        if model.ffn % tp:
            return (f"tp must divide the bottleneck width: got tp={tp} for width {model.ffn} ({model.preset}); "
                    f"use a tp that divides {model.ffn}")
    elif model.heads % tp or model.kv_heads % tp:
        return (f"tp must divide the attention heads: got tp={tp} for {model.heads} heads and "
                f"{model.kv_heads} key/value heads ({model.preset}); use a tp that divides {model.kv_heads}")
    if model.ffn % tp:
        return f"tp must divide the MLP width: got tp={tp} for ffn={model.ffn}; use a divisor of it"
    if cluster is not None:
        if cluster.gpus % tp:
            return f"tp must divide --gpus: got tp={tp} for --gpus {cluster.gpus}"
        if tp > cluster.devices_per_node and not cluster.allow_cross_node_tp:
            return (f"tp must stay within a node: got tp={tp} with {cluster.devices_per_node} devices per "
                    "node; lower tp, or let it span nodes (estimate's --allow-cross-node-tp, a search space's "
                    "tp_within_node: false)")
    return ""


#: The searches (sweeps and automatic pp domains) propose an uneven pipeline split only when its busiest
#: rank holds at most this much more than the mean: a rank with one layer more than the others sets
#: every pipeline slot, so the others wait that long (a pinned pp is taken whatever its balance).
SEARCHED_STAGE_IMBALANCE = 1.10


def empty_end_chunks_ok(model: ModelSpec) -> bool:
    """Whether ``model``'s first and last pipeline chunk may hold no layer (the embeddings alone, the
    head alone): a transformer with one list of its own layers. Not an encoder-decoder's joined
    stacks, a shared layer's calls, a convolutional net's blocks or a model file's."""
    return not (model.encoder_decoder or model.shared_layers or is_convolutional(model.family)
                or model.family == "user")


def max_chunks(model: ModelSpec) -> int:
    """The most pipeline chunks ``model`` splits into: a block each, plus the embeddings and the head
    alone where ``empty_end_chunks_ok``."""
    return model.blocks + (2 if empty_end_chunks_ok(model) else 0)


def chunk_sizes(layers: int, chunks: int) -> list[int]:
    """Layers in each of ``chunks`` pipeline chunks (chunk ``c`` on pipeline rank ``c % pp``).

    Equal when ``chunks`` divides ``layers``; else as even as they can be (sizes differ by one) with
    the smaller chunks at the pipeline's ends, outermost first: the first chunk also runs the
    embedding and the last the head and the loss (Llama 3 405B puts one layer fewer on its first
    and last stage for that reason; Dubey et al. 2024, section 3.3.2). With one chunk more than
    layers the first holds none, with two the last too (Llama 3's 126 layers in 128 chunks: the
    embedding alone, then a layer a chunk, then the head alone). Needs ``1 <= chunks <= layers + 2``.
    """
    base, extra = divmod(layers, chunks)
    if not extra:
        return [base] * chunks
    outside_in = dict.fromkeys(c for pair in zip(range(chunks), reversed(range(chunks)), strict=True) for c in pair)
    smaller = set(list(outside_in)[:chunks - extra])
    return [base if c in smaller else base + 1 for c in range(chunks)]


def chunk_bounds(layers: int, chunks: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each pipeline chunk's layers (``chunk_sizes``)."""
    return list(_chunk_bounds(layers, chunks))


@functools.cache
def _chunk_bounds(layers: int, chunks: int) -> tuple[tuple[int, int], ...]:
    # cached: a sweep asks for the same few splits hundreds of thousands of times
    out, start = [], 0
    for n in chunk_sizes(layers, chunks):
        out.append((start, start + n))
        start += n
    return tuple(out)


def rank_layers(layers: int, pp: int, virtual_stages: int = 1) -> list[list[int]]:
    """The layers each pipeline rank runs, by rank: its chunks' (chunk ``c`` on rank ``c % pp``), in order."""
    return [list(r) for r in _rank_layers(layers, pp, virtual_stages)]


@functools.cache
def _rank_layers(layers: int, pp: int, virtual_stages: int) -> tuple[tuple[int, ...], ...]:
    ranks: list[list[int]] = [[] for _ in range(pp)]
    for c, (a, b) in enumerate(_chunk_bounds(layers, pp * virtual_stages)):
        ranks[c % pp].extend(range(a, b))
    return tuple(tuple(r) for r in ranks)


def stage_imbalance(layers: int, pp: int, virtual_stages: int = 1) -> float:
    """The busiest pipeline rank's layers over the mean (1.0 for an even split)."""
    return max(len(r) for r in rank_layers(layers, pp, virtual_stages)) * pp / layers


def pp_problem(pp: int, model: ModelSpec, cluster: ClusterSpec | None = None, virtual_stages: int = 1) -> str:
    """Why ``pp`` (x ``virtual_stages`` chunks) cannot split ``model`` (on ``cluster``), or ""."""
    chunks = pp * virtual_stages
    if chunks > 1 and model.family == "user" and not model.extra.get("layers"):
        return (f"pipeline stages need the model file to declare layers (stages are cut between its blocks): got "
                f"pp={pp} for {model.preset}.py; add layers = \"<ModuleList path>\" to it or use pp=1")
    ends = empty_end_chunks_ok(model)
    if chunks > max_chunks(model):
        # an encoder-decoder's stages split one list, the encoder's blocks then the decoder's
        unit = "block" if is_convolutional(model.family) or model.encoder_decoder else "layer"
        got = (f"{model.layers} encoder + {model.decoder_layers} decoder blocks" if model.encoder_decoder
               else f"{model.layers} {unit}s")
        rule = ", but the first and the last (the embeddings, the head)" if ends else ""
        return (f"pipeline chunks must each hold a {unit}{rule}: got {got} for pp={pp} x virtual_stages="
                f"{virtual_stages} ({chunks} chunks); use pp x virtual_stages <= {max_chunks(model)}")
    if cluster is not None and cluster.gpus % pp:
        return f"pp must divide --gpus: got pp={pp} for --gpus {cluster.gpus}"
    return ""


def user_problem(config: ScheduleConfig, model: ModelSpec) -> str:
    """Why ``config`` cannot run a user's own module (family ``user``), or "" when it can.

    Checkpointing needs the file's ``layers``, selective recomputation its ``family`` too (where a
    block's attention is); sequence parallelism, the chunked loss and compiled layers are not offered
    for it (the loss is its own).
    """
    if model.family != "user":
        return ""
    off = user_unsupported(config)  # first: no other knob's setting makes these run
    if off:
        return (f"a user's own module ({model.preset}) cannot take {', '.join(off)}; "
                f"leave {'it' if len(off) == 1 else 'them'} at the default{'' if len(off) == 1 else 's'}")
    if config.ckpt_ratio > 0 and not model.extra.get("layers"):
        return (f"checkpointing needs the model file to declare layers: got ckpt_ratio={config.ckpt_ratio:g} for "
                f"{model.preset}.py; add layers = \"<ModuleList path>\" to it or use ckpt_ratio 0")
    if config.ckpt_granularity == "selective" and config.ckpt_ratio > 0 and not model.extra.get("kernels"):
        return (f"selective recomputation needs the model file to declare family (where a block's attention is): "
                f"got ckpt_granularity=selective for {model.preset}.py; add family = autoslapo.FamilyDescription(...) "
                "to it or use ckpt_granularity full")
    return ""


def user_unvaried_knobs(model: ModelSpec, knobs: Iterable[Knob]) -> tuple[str, ...]:
    """The names of ``knobs`` a search never varies for a user's module (empty for other families): those
    it does not take (``Knob.user_file`` off) and those whose every other value ``user_knob_ok`` rules
    out for this file."""
    if model.family != "user":
        return ()
    return tuple(k.name for k in knobs if not k.user_file or (
        k.sweep is not None and not any(v != k.default and user_knob_ok(k.name, v, model) for v in k.sweep)))


def user_unsupported(config: ScheduleConfig) -> list[str]:
    """The knob settings of ``config`` that a user's own module never takes (its loss, products and
    layers' insides are its own; ``Knob.user_file`` off, and per-op recomputation): the one list
    ``user_problem`` and the user schedule refuse by."""
    from autoslapo.config import KNOBS  # that module imports this one

    off = [k.name if k.kind == "bool" else f"{k.name}={getattr(config, k.name)}" for k in KNOBS
           if not k.user_file and getattr(config, k.name) != k.default]
    return off + (["ckpt_granularity=op"] if config.ckpt_granularity == "op" and config.ckpt_ratio > 0 else [])


def op_ckpt_ok(model: ModelSpec) -> bool:
    """Whether per-op recomputation (``ckpt_granularity="op"``) is offered for ``model``: the
    transformer families (not a user's module, whose traced shape does not say its products, nor a
    convolutional one)."""
    return not (model.family == "user" or is_convolutional(model.family))


def user_knob_ok(knob: str, value: object, model: ModelSpec) -> bool:
    """Whether a searched knob's value can change a user's module's run (always True for other families).

    Without ``layers`` only ckpt_ratio 0; without ``family`` only the default attention kernel and no
    fusion (the schedule does not touch its attention or MLP), nor with a family whose attention has no
    core to rewrite (it calls its own kernel) or that names no bias + GeLU; selective recomputation needs
    ``family`` and ``layers``, so the search does not repeat itself.
    """
    if model.family != "user":
        return True
    if knob == "ckpt_ratio":
        return value == 0.0 or bool(model.extra.get("layers"))
    if knob == "ckpt_granularity":
        return value == "full" or (value == "selective" and bool(model.extra.get("kernels") and model.extra.get("layers")))
    if knob in ("attn_kernel", "fuse_bias_gelu"):  # a file traced before 2026-12-04 says only "kernels"
        can = model.extra.get({"attn_kernel": "attn_core", "fuse_bias_gelu": "bias_gelu"}[knob], model.extra.get("kernels"))
        return bool(can) or value == {"attn_kernel": "sdpa", "fuse_bias_gelu": False}[knob]
    return True


def tp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Every tp that can shard ``model`` on ``cluster``, ascending."""
    return [t for t in divisors(cluster.gpus) if not tp_problem(t, model, cluster)]


def pp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Every pp that can split ``model`` on ``cluster`` and that the searches propose, ascending: an
    uneven split only within ``SEARCHED_STAGE_IMBALANCE``."""
    return [p for p in divisors(cluster.gpus) if not pp_problem(p, model, cluster)
            and stage_imbalance(model.blocks, p) <= SEARCHED_STAGE_IMBALANCE]


def layouts(model: ModelSpec, cluster: ClusterSpec, *, tp: int | None = None, pp: int | None = None,
            dp: int | None = None) -> Iterator[tuple[int, int, int]]:
    """Every (tp, pp, dp) of ``cluster`` that can run ``model``, optionally with degrees pinned."""
    # a pinned pp is taken as given (however uneven its split), if it can split the model at all
    if pp is None:
        pps = pp_degrees(model, cluster)
    else:
        pps = [] if pp_problem(pp, model, cluster) else [pp]
    for t in tp_degrees(model, cluster):
        if tp is not None and t != tp:
            continue
        for p in pps:
            if cluster.gpus % (t * p):
                continue
            d = cluster.gpus // (t * p)
            if dp is None or d == dp:
                yield t, p, d


def replica_counts(gpus: int, tps: Collection[int], pps: Collection[int]) -> list[int]:
    """The distinct dp that (tp, pp) pairs of the domains give on ``gpus`` devices, ascending."""
    return sorted({gpus // (t * p) for t in tps for p in pps if gpus % (t * p) == 0})


def batch_fits_some_layout(global_batch: int, gpus: int, tps: Collection[int], pps: Collection[int],
                           micro_batches: Collection[int]) -> bool:
    """Whether some (tp, pp, micro_batch) of the domains splits ``global_batch`` over its replicas."""
    return any(global_batch % (int(mb) * d) == 0 for d in replica_counts(gpus, tps, pps) for mb in micro_batches)


def check_layout(config: ScheduleConfig, model: ModelSpec, cluster: ClusterSpec | None = None) -> None:
    """Check ``config``'s degrees and kernels against ``model`` and (optionally) ``cluster``.

    Raises ConfigError naming the rule, the values and the fix.
    """
    if cluster is not None and config.world_size != cluster.gpus:
        raise ConfigError(
            f"tp*pp*dp must equal --gpus: got tp={config.tp}, pp={config.pp}, dp={config.dp} "
            f"({config.world_size}) for --gpus {cluster.gpus}; pick degrees whose product is {cluster.gpus}"
        )
    problem = (tp_problem(config.tp, model, cluster) or pp_problem(config.pp, model, cluster, config.virtual_stages)
               or user_problem(config, model))
    if problem:
        raise ConfigError(problem)
    if config.sequence_parallel and model.encoder_decoder and config.tp > 1:
        raise ConfigError(
            f"sequence_parallel is not supported for {model.family} (its cross-attention reads the whole "
            f"encoder output): got tp={config.tp} for {model.preset}; turn sequence_parallel off"
        )
    if config.attn_kernel == "flash" and model.encoder_decoder:
        raise ConfigError(f"attn_kernel flash is not supported for {model.family} (transformers has no "
                          f"FlashAttention path with T5's position bias): use sdpa or eager")
    if config.attn_kernel == "flash" and model.local_attention:
        raise ConfigError(
            f"attn_kernel flash cannot apply {model.family}'s local (windowed) attention masks: got "
            f"attn_kernel=flash for {model.preset}; use sdpa or eager"
        )
    if config.sequence_parallel and not model.sequence_parallel_ok:
        raise ConfigError(
            f"sequence_parallel cannot split {model.family}'s layers (its attention module adds its own "
            f"input back as a residual): got sequence_parallel on for {model.preset}; turn it off"
        )
    # the knobs ``inapplicable_knobs`` names, read off the config's own field declarations (once: a hot path)
    for name, default, flag, why in _restricted_fields(model.family):
        if getattr(config, name) != default:
            raise ConfigError(f"{name} {why}: got {getattr(config, name)!r}; leave {flag} at its default {default!r}")
    if config.attn_kernel == "flash" and config.precision == "fp32":
        raise ConfigError("attn_kernel flash needs 16-bit inputs (FlashAttention has fp16 and bf16 kernels only): "
                          "got precision=fp32; use sdpa or eager, or precision bf16 / fp16")
    if config.sequence_parallel and model.seq_len % config.tp:
        raise ConfigError(
            f"sequence_parallel needs seq_len divisible by tp: got seq_len={model.seq_len}, tp={config.tp}"
        )
    if cluster is not None:
        dev = cluster.device
        if config.attn_kernel == "flash" and not dev.flash_attention:
            raise ConfigError(f"attn_kernel flash needs a device with FlashAttention: {dev.name} has none; use sdpa")
        if config.precision == "bf16" and not dev.bf16:
            raise ConfigError(f"precision bf16 is not supported on {dev.name}; use fp16 or fp32")


def knob_applies(knob: Knob, family: str) -> bool:
    """Whether ``knob`` acts on a model of ``family`` (a convolutional one has no attention knob)."""
    return not _why_inapplicable(knob, family)


def _why_inapplicable(knob: Knob, family: str) -> str:
    """Why ``family`` cannot use ``knob``; empty when it can."""
    if knob.families and family not in knob.families:
        return f"applies to the {', '.join(knob.families)} families only ({family} has nothing it acts on)"
    if is_convolutional(family) and knob.transformer_only:
        return f"does not apply to {family} (a convolutional family has no attention, tokens or vocabulary)"
    if not is_convolutional(family) and knob.conv_only:
        return f"applies to a convolutional family only ({family} has no feature maps to lay out)"
    return ""


@functools.cache
def _restricted_fields(family: str) -> tuple[tuple[str, object, str, str], ...]:
    """(name, default, flag, why) of the ``ScheduleConfig`` knobs ``family`` cannot use, as
    ``autoslapo.config.KNOBS`` binds them (its flags and defaults)."""
    from autoslapo.config import KNOBS  # that module imports this one

    whys = ((k, _why_inapplicable(k, family)) for k in KNOBS)
    return tuple((k.name, k.default, k.flag, why) for k, why in whys if why)


def inapplicable_knobs(model: ModelSpec, knobs: Iterable[Knob]) -> tuple[str, ...]:
    """The names of ``knobs`` (``autoslapo.config.KNOBS``) that ``model``'s family cannot use:
    ``Knob.transformer_only`` ones on a convolutional family, ``Knob.conv_only`` ones on any other,
    ``Knob.families`` ones on a family they do not name. They stay at their defaults in spaces and
    sweeps, and ``check_layout`` refuses a config that sets one otherwise. A user's own module: also the
    knobs it does not take (``Knob.user_file`` off; ``user_problem`` refuses them)."""
    user = model.family == "user"
    return tuple(k.name for k in knobs if _why_inapplicable(k, model.family) or (user and not k.user_file))


def default_precision(has_bf16: bool, runnable: Collection[str] | None = None) -> str:
    """The precision a schedule gets unless one is given: bf16 where the device has it; else fp16,
    unless the trials cannot run it (``runnable``: the precisions the runtime can run; None: all,
    as the cost model can), then fp32."""
    if has_bf16 and (runnable is None or "bf16" in runnable):
        return "bf16"
    return "fp16" if runnable is None or "fp16" in runnable else "fp32"
