"""T5 (``T5ForConditionalGeneration``) as pipeline stages: one layer list, encoder blocks then decoder blocks.

Cuts index into that list (``join_layer_lists(["encoder.block", "decoder.block"])``): they may fall
inside either stack or between them. What passes between stages is the pair (encoder hidden
states, decoder hidden states):

* the first stage embeds the source (``input_ids``) and the labels shifted right (T5's
  ``_shift_right``: the decoder's input when ``labels`` are given), each through its stack's dropout;
* an encoder block updates the first of the pair; after the encoder's last block (in whichever
  stage holds it) the encoder's final norm and dropout turn it into the encoder's output;
* a decoder block updates the second, attending over the first;
* the last stage applies the decoder's final norm and dropout, the ``d_model**-0.5`` scaling
  (``config.scale_decoder_outputs``: a tied head) and the LM head.

T5 computes each stack's relative position bias in its block 0 and hands it on to the later blocks;
here every stage computes it from block 0's ``relative_attention_bias`` table (the same arithmetic
as ``T5Attention.compute_bias``), and every stage holding blocks of a stack owns that table, so a
table used by stages on several pipeline ranks has its gradients summed (``find_tied``). Under
tensor parallelism each rank's table holds its heads' columns, as its attention modules do.
Masks are rebuilt as T5's stacks build them without a padding mask (full-length batches).

The adapter keeps no reference to the model, only its small pieces (configs, the two tables, the
final norms), so a pipeline rank that drops the model keeps just its stages' parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoslapo.errors import ConfigError

__all__ = ["T5_INPUT_KEYS", "T5StageAdapter", "t5_stage_adapter"]

#: The batch keys the first stage takes: the source and the labels (the decoder's input, shifted).
T5_INPUT_KEYS = ("input_ids", "labels")
_TABLE = "block.0.layer.0.SelfAttention.relative_attention_bias"


@dataclass(frozen=True, eq=False)
class T5StageAdapter:
    """The :class:`~autoslapo.models.adapters.PipelineAdapter` of ``T5ForConditionalGeneration``.

    ``layer_lists`` names the two block lists run as one; ``stage_paths(start, stop)`` the modules a
    stage holding blocks ``[start, stop)`` of that list owns besides them (tables, the encoder's norm).
    Build one with :func:`t5_stage_adapter`.
    """

    encoder_blocks: int
    encoder_ids: frozenset[int]
    last_encoder_id: int
    enc_config: Any
    dec_config: Any
    enc_table: nn.Embedding
    dec_table: nn.Embedding
    enc_norm: nn.Module
    enc_dropout: nn.Module
    dec_dropout: nn.Module
    scale: float | None
    start_token: int
    pad_token: int
    input_keys: tuple[str, ...] = T5_INPUT_KEYS
    layers_path: str = "encoder.block"
    layer_lists: tuple[str, ...] = ("encoder.block", "decoder.block")
    first_paths: tuple[str, ...] = ("encoder.embed_tokens", "decoder.embed_tokens")
    last_paths: tuple[str, ...] = ("decoder.final_layer_norm", "lm_head")

    def stage_paths(self, start: int, stop: int) -> tuple[str, ...]:
        """Modules the stage holding layers ``[start, stop)`` owns: each stack's relative-position
        table when it holds blocks of that stack; the encoder's final norm with its last block."""
        out = []
        if start < self.encoder_blocks:
            out.append(f"encoder.{_TABLE}")
        if start < self.encoder_blocks <= stop:
            out.append("encoder.final_layer_norm")
        if stop > self.encoder_blocks:
            out.append(f"decoder.{_TABLE}")
        return tuple(out)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's input from the labels, as ``T5PreTrainedModel._shift_right`` makes it."""
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = self.start_token
        return shifted.masked_fill(shifted == -100, self.pad_token)

    def embed(self, parts: Mapping[str, nn.Module], input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        """(encoder, decoder) hidden states: the embedded source and shifted labels, after dropout."""
        enc = self.enc_dropout(parts["encoder.embed_tokens"](input_ids))
        dec = self.dec_dropout(parts["decoder.embed_tokens"](self.shift_right(labels)))
        return enc, dec

    def _bias(self, table: nn.Embedding, config: Any, length: int, device: torch.device) -> torch.Tensor:
        from transformers.models.t5.modeling_t5 import T5Attention

        pos = torch.arange(length, dtype=torch.long, device=device)
        bucket = T5Attention._relative_position_bucket(
            pos[None, :] - pos[:, None],
            bidirectional=not config.is_decoder,
            num_buckets=config.relative_attention_num_buckets,
            max_distance=config.relative_attention_max_distance,
        )
        return table(bucket).permute([2, 0, 1]).unsqueeze(0)  # (1, heads, q, k)

    def context(self, hidden: Any) -> dict[str, Any]:
        """Both stacks' masks and relative position biases, rebuilt from the pair's shapes."""
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

        enc, dec = hidden
        return {
            "enc_mask": create_bidirectional_mask(config=self.enc_config, inputs_embeds=enc, attention_mask=None),
            "enc_bias": self._bias(self.enc_table, self.enc_config, enc.shape[1], enc.device),
            "dec_mask": create_causal_mask(config=self.dec_config, inputs_embeds=dec, attention_mask=None,
                                           cache=None),
            "dec_bias": self._bias(self.dec_table, self.dec_config, dec.shape[1], dec.device),
            "cross_mask": create_bidirectional_mask(config=self.dec_config, inputs_embeds=dec, attention_mask=None,
                                                    encoder_hidden_states=enc),
        }

    def layer(self, layer: nn.Module, hidden: Any, context: Mapping[str, Any]) -> Any:
        """Run one block on its stream of the pair (positional arguments, as ``T5Stack`` passes them)."""
        enc, dec = hidden
        if id(layer) in self.encoder_ids:
            enc = layer(enc, context["enc_mask"], context["enc_bias"], None, None, None)[0]
            if id(layer) == self.last_encoder_id:
                enc = self.enc_dropout(self.enc_norm(enc))
            return enc, dec
        dec = layer(dec, context["dec_mask"], context["dec_bias"], enc, context["cross_mask"], None)[0]
        return enc, dec

    def head(self, parts: Mapping[str, nn.Module], hidden: Any) -> torch.Tensor:
        """Logits from the decoder's states: final norm, dropout, the tied head's scaling, the head."""
        out = self.dec_dropout(parts["decoder.final_layer_norm"](hidden[1]))
        if self.scale is not None:
            out = out * self.scale
        return parts["lm_head"](out)  # type: ignore[no-any-return]


def t5_stage_adapter(model: nn.Module) -> T5StageAdapter:
    """The stage adapter of a ``T5ForConditionalGeneration`` (as built, scheduled or not).

    Raises: ConfigError for a T5 model without the LM head (``T5Model``, ``T5EncoderModel``): only
    the LM class trains against labels here.
    """
    if not all(hasattr(model, name) for name in ("encoder", "decoder", "lm_head")):
        raise ConfigError(
            f"T5 pipeline stages need T5ForConditionalGeneration (encoder, decoder, lm_head): got "
            f"{type(model).__name__}; build the model with autoslapo.models.build_model"
        )
    encoder, decoder = model.get_submodule("encoder"), model.get_submodule("decoder")
    blocks = list(encoder.get_submodule("block").children())
    config: Any = model.config
    scale = float(config.d_model) ** -0.5 if getattr(config, "scale_decoder_outputs", False) else None
    return T5StageAdapter(
        encoder_blocks=len(blocks),
        encoder_ids=frozenset(id(b) for b in blocks),
        last_encoder_id=id(blocks[-1]),
        enc_config=encoder.config,
        dec_config=decoder.config,
        enc_table=encoder.get_submodule(_TABLE),  # type: ignore[arg-type]
        dec_table=decoder.get_submodule(_TABLE),  # type: ignore[arg-type]
        enc_norm=encoder.get_submodule("final_layer_norm"),
        enc_dropout=encoder.get_submodule("dropout"),
        dec_dropout=decoder.get_submodule("dropout"),
        scale=scale,
        start_token=int(config.decoder_start_token_id),
        pad_token=int(config.pad_token_id),
    )
