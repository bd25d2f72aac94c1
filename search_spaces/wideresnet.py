"""Convolutional families (WideResNet): what a conv net's schedule can change.

tp splits the bottlenecks' widths (Slapo's WRN schedule), checkpointing goes by blocks, DP/ZeRO as
for every model, pipeline stages of equal block counts (feature maps between them), and no attention, sequence-parallel, loss-kernel or fusion knobs (``Knob.transformer_only``: they stay
at their defaults). Images are small next to a transformer's sequences, so micro-batches go to 256
and the default global batch is 64 images a device (ImageNet recipes: 256 over 8 devices and up).
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

WIDERESNET = SearchSpace(
    name="wideresnet",
    version="2",
    description="convolutional: tp over bottleneck widths, pp over blocks, micro-batch, checkpoint ratio over "
                "blocks, ZeRO",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
    },
    fixed={"pipeline_schedule": "1f1b", "compile_layers": False},
    rules={"max_micro_batch": 256, "batch_per_gpu": 64},
)
