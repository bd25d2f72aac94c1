"""FLOP counts of one training step, after Megatron-LM's accounting. Pure.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
(SC'21), appendix: a transformer layer's forward pass costs ``24 B s h^2 (1 + s / 6h)`` FLOPs
(the q/k/v/out and two MLP matrices, plus the two ``s x s`` attention products counted in full),
the logit layer ``2 B s h V``; backward costs twice forward; full recomputation adds one more
forward of every layer, giving ``96 B s L h^2 (1 + s/6h + V/16Lh)`` per iteration.

Here the same count is written per matrix so it also holds for an MLP width other than ``4h``,
gated (SwiGLU) MLPs and grouped-query attention. BERT's MLM head adds its ``h x h`` transform.
The attention products are counted in full even for causal models, as Megatron does, and for
GPT-Neo's local (windowed) layers, whose kernels (eager and SDPA with a mask) compute every score.
A shared layer (ALBERT) costs its FLOPs on every call: ``layers`` counts calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoslapo.cost.encdec import encdec_flops_per_sample, encdec_hw_flops_per_sample
from autoslapo.models.spec import is_convolutional
from autoslapo.models.wrn_shape import block_convs, stage_blocks, stem_convs

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec


def layer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one layer's weight matrices (q, k, v, out, MLP)."""
    h, f = model.hidden, model.ffn
    kvd = model.kv_heads * model.head_dim
    attn = 2 * h * (h + 2 * kvd) + 2 * h * h
    mlp = 2 * h * f * (3 if model.gated_mlp else 2)
    return float(attn + mlp)


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ``Q K^T`` and ``P V`` over the full sequence (``4 s h``)."""
    return float(4 * model.seq_len * model.heads * model.head_dim)


def layer_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one transformer layer (a user's module: one block's, as traced)."""
    if model.family == "user":
        return float(model.extra["layer_fwd_flops"]) / model.seq_len
    return layer_matmul_flops_per_token(model) + attention_flops_per_token(model)


def head_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the output head: logits (``2 h V``), plus BERT's MLM transform.

    ALBERT's factorized embedding of width E: logits ``2 E V``, its transform ``2 h E`` and, counted
    here too, the ``E -> h`` map at the encoder's input (``2 E h``).
    """
    h, e = model.hidden, model.embedding_size
    flops = 2 * e * model.vocab
    if not model.causal:  # BERT/RoBERTa MLM head: dense h x h + LayerNorm before the decoder
        flops += 2 * h * e
    if e != h:
        flops += 2 * e * h
    return float(flops)


def model_flops_per_sample(model: ModelSpec) -> float:
    """FLOPs of forward + backward for one sequence, no recomputation (Megatron's model FLOPs).

    A user's module (family ``user``): three times the forward FLOPs its trace counted.
    """
    if model.family == "user":
        return 3.0 * float(model.extra["fwd_flops"])
    if model.encoder_decoder:  # T5: encoder over the source, decoder and head over the target
        return encdec_flops_per_sample(model)
    if is_convolutional(model.family):
        return 3.0 * conv_forward_flops(model)
    fwd = model.layers * layer_flops_per_token(model) + head_flops_per_token(model)
    return 3.0 * fwd * model.seq_len


def hw_flops_per_sample(model: ModelSpec, config: ScheduleConfig) -> float:
    """FLOPs actually executed per sequence: model FLOPs plus the recomputed forward passes."""
    if model.encoder_decoder:
        return encdec_hw_flops_per_sample(model, config)
    if is_convolutional(model.family):
        blocks = block_forward_flops(model)
        return model_flops_per_sample(model) + sum(blocks[i] for i in config.checkpointed_layers(model.layers))
    recomputed = len(config.checkpointed_layers(model.layers))
    if model.family == "user" and not model.extra.get("layers"):
        recomputed = 0  # no blocks to checkpoint
    if config.ckpt_granularity == "selective":  # only the attention core runs again
        core = (float(model.extra["attn_core_flops"]) if model.family == "user"
                else attention_flops_per_token(model) * model.seq_len)
        return model_flops_per_sample(model) + recomputed * core
    return model_flops_per_sample(model) + recomputed * layer_flops_per_token(model) * model.seq_len


def megatron_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int,
                                 recompute: bool = True) -> float:
    """Narayanan et al.'s closed form: ``96 (or 72) B s L h^2 (1 + s/6h + V/(16 L h))``.

    Kept as the reference the per-matrix count is tested against (GPT shape, ffn = 4h).
    """
    b, s, L, h, V = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72.0 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


# -- a convolutional family (WideResNet): 2 x K^2 x Cin x Cout x Hout x Wout per convolution ---------


def block_forward_flops(model: ModelSpec) -> list[float]:
    """Forward FLOPs per image of each WideResNet bottleneck block (its convolutions, shortcut included)."""
    convs = block_convs(model.hidden, model.ffn, model.layers, model.seq_len)
    return [float(sum(c.flops_per_sample for c in block)) for block in convs]


def conv_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per image of a WideResNet: stem, blocks and the classifier (``2 C classes``)."""
    stem, _ = stem_convs(model.hidden, model.seq_len)
    features = model.hidden * 2 ** (len(stage_blocks(model.layers)) - 1)
    return stem.flops_per_sample + sum(block_forward_flops(model)) + 2.0 * features * model.vocab
