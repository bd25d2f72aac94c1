"""The user's own module (``autoslapo tune my_model.py``): what its file declares decides the knobs.

Always: data parallelism, ZeRO, micro-batch (and so gradient accumulation). With ``layers``: the
checkpoint ratio and placement, and pipeline stages cut between the blocks (GPipe or 1F1B; each
stage runs the file's forward: ``autoslapo.user_pipeline``). With ``family``: tensor parallelism,
the attention kernel, bias + GeLU fusion and (with ``layers``) selective recomputation. Values a
file does not allow are dropped when the space is bound (``tp`` and ``pp`` by the layout rules;
``ckpt_ratio`` without ``layers`` and the kernels without ``family`` by
``autoslapo.layout.user_knob_ok``); sequence parallelism and the chunked loss are not offered.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

USER = SearchSpace(
    name="user",
    version="3",
    description="your own module: dp, ZeRO, micro-batch; checkpointing and pp with layers; tp and kernels with family",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa"],
        "fuse_bias_gelu": [False, True],
        "pipeline_schedule": ["gpipe", "1f1b"],
        "ckpt_granularity": ["full", "selective"],
    },
    fixed={"compile_layers": False, "sequence_parallel": False, "loss_kernel": "eager"},
)
