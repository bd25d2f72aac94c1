"""Encoder-decoder family (T5): no biases, so nothing to fuse; pipeline stages over the encoder's
then the decoder's blocks (pp dividing them all, ``autoslapo.layout``), GPipe or 1F1B, interleaved
where the blocks allow; no sequence parallelism yet, and no FlashAttention path in transformers for
T5's position bias, so the attention kernel is eager or SDPA.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

T5 = SearchSpace(
    name="t5",
    version="2",
    description="encoder-decoder: tp, pp over both stacks (gpipe/1f1b/interleaved), micro-batch, checkpoint "
                "ratio over both stacks, ZeRO, attention",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa"],
        "pipeline_schedule": ["gpipe", "1f1b", "interleaved"],
        "virtual_stages": [1, 2],
    },
    fixed={"compile_layers": False, "sequence_parallel": False, "fuse_bias_gelu": False},
)
