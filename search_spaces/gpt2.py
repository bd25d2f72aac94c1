"""Decoder families with a GELU MLP (GPT-2, OPT): adds sequence parallelism and interleaved pipelines.

At GPT-2-XL / OPT-13B sizes on tens of GPUs, tensor parallelism is worth pairing with sequence
parallelism (it shards the LayerNorm/dropout activations) and deep pipelines with interleaving.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

GPT2 = SearchSpace(
    name="gpt2",
    version="1",
    description="decoder: tp (+sequence parallel), pp (gpipe/1f1b/interleaved), micro-batch, checkpointing, ZeRO, attention",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa", "flash"],
        "fuse_bias_gelu": [False, True],
        "sequence_parallel": [False, True],
        "pipeline_schedule": ["gpipe", "1f1b", "interleaved"],
        "virtual_stages": [1, 2],
    },
    fixed={"compile_layers": False},
    rules={"batch_per_gpu": 4, "max_micro_batch": 32},
)
