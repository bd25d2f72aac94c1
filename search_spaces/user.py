"""The user's own module (``autoslapo tune my_model.py``): what its file declares decides the knobs.

Always: data parallelism, ZeRO, micro-batch (and so gradient accumulation). With ``layers``: the
checkpoint ratio and placement. With ``family``: tensor parallelism, the attention kernel and bias
+ GeLU fusion. Values a file does not allow are dropped when the space is bound (``tp`` by the
layout rules; ``ckpt_ratio`` without ``layers`` by ``autoslapo.layout.user_problem``); pipeline
stages, sequence parallelism, the chunked loss and selective recomputation are not offered.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

USER = SearchSpace(
    name="user",
    version="1",
    description="your own module: dp, ZeRO, micro-batch; checkpointing with layers; tp and kernels with family",
    knobs={
        "tp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa"],
        "fuse_bias_gelu": [False, True],
    },
    fixed={"pp": 1, "pipeline_schedule": "1f1b", "compile_layers": False, "sequence_parallel": False,
           "loss_kernel": "eager", "ckpt_granularity": "full"},
)
