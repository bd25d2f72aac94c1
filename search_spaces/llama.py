"""LLaMA: SwiGLU MLP without biases (no bias+GELU to fuse), grouped-query attention.

tp is bounded by the key/value heads (8 for 70B), which ``bind`` enforces; at 70B the useful
micro-batches are small, so the domain stops at 16.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

LLAMA = SearchSpace(
    name="llama",
    version="1",
    description="LLaMA: tp (+sequence parallel), pp (gpipe/1f1b/interleaved), micro-batch, checkpointing, ZeRO, attention",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa", "flash"],
        "sequence_parallel": [False, True],
        "pipeline_schedule": ["gpipe", "1f1b", "interleaved"],
        "virtual_stages": [1, 2],
    },
    fixed={"fuse_bias_gelu": False, "compile_layers": False},
    rules={"batch_per_gpu": 4, "max_micro_batch": 16, "max_global_batch": 1024},
)
