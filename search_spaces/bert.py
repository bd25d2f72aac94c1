"""Encoder families (BERT, RoBERTa): GELU MLP with biases, so bias+GELU fusion is a knob.

Models of this size rarely want pipelines deeper than a node, and never interleaving; the
schedule choice between GPipe and 1F1B is kept because it trades memory for nothing else.
"""

from __future__ import annotations

from search_spaces.space import SearchSpace

BERT = SearchSpace(
    name="bert",
    version="1",
    description="encoder: tp, pp (gpipe/1f1b), micro-batch, checkpoint ratio, ZeRO, attention, bias+GELU fusion",
    knobs={
        "tp": "auto",
        "pp": "auto",
        "micro_batch": "auto",
        "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
        "zero_stage": [0, 1, 2, 3],
        "attn_kernel": ["eager", "sdpa", "flash"],
        "fuse_bias_gelu": [False, True],
        "pipeline_schedule": ["gpipe", "1f1b"],
    },
    fixed={"compile_layers": False, "sequence_parallel": False},
)
