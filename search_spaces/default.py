"""The default search space: every family-independent knob, for families without their own."""

from __future__ import annotations

from search_spaces.space import SearchSpace

DEFAULT = SearchSpace(
    name="default",
    version="1",
    description="tp, pp, micro-batch, checkpoint ratio, ZeRO stage and attention kernel",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa", "flash"],
    },
    fixed={"pipeline_schedule": "1f1b", "fuse_bias_gelu": False, "compile_layers": False},
)
