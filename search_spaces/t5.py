"""Encoder-decoder family (T5): no biases, so nothing to fuse; no pipeline stages and no sequence
parallelism yet (``autoslapo.layout`` refuses them for T5), and no FlashAttention path in
transformers for T5's position bias, so the attention kernel is eager or SDPA.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

T5 = SearchSpace(
    name="t5",
    version="1",
    description="encoder-decoder: tp, micro-batch, checkpoint ratio over both stacks, ZeRO, attention",
    knobs={
        "tp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa"],
    },
    fixed={"pp": 1, "compile_layers": False, "sequence_parallel": False, "fuse_bias_gelu": False},
)
