"""The README's schedule-language example, runnable: Megatron-style TP on a tiny BERT, verified.

    python experiments/schedule_example.py            # 2 CPU ranks (gloo)

Each rank builds the same model (same seed), applies the primitives by hand inside ``Verify``, and
on exit ``Verify`` checks that outputs and every parameter's gradient (gathered over the ranks)
equal the unscheduled model's. Then a deliberately wrong schedule (a row-parallel layer without its
all-reduce) must fail, naming what differs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tp_bert(correct: bool) -> str:
    """Runs on every rank: schedule a tiny BERT by hand and verify it."""
    import torch.distributed as dist

    import autoslapo
    from autoslapo.errors import VerifyError
    from autoslapo.models import ModelSpec
    from autoslapo.models.build import build_model, example_batch

    spec = ModelSpec.from_name("bert-tiny")
    model = build_model(spec, seed=0, dropout=0.0)
    batch = example_batch(spec, 2, seed=1)
    sch = autoslapo.create_schedule(model, group=dist.group.WORLD)
    try:
        with autoslapo.Verify(sch, {"input_ids": batch["input_ids"]}):
            for i in range(spec.layers):
                layer = sch[f"bert.encoder.layer.{i}"]
                attn = layer["attention.self"]
                for name in ("query", "key", "value"):          # column-parallel q, k, v
                    attn[name].shard("weight", axis=0)
                    attn[name].shard("bias", axis=0)
                attn.shrink_attr("num_attention_heads", "all_head_size")
                attn.sync("bwd_post", "all_reduce")            # their input's gradient is summed once
                layer["attention.output.dense"].shard("weight", axis=1)   # row-parallel output
                if correct:
                    layer["attention.output.dense"].sync("fwd_post", "all_reduce")
                layer["intermediate.dense"].shard("weight", axis=0)       # column-parallel MLP in
                layer["intermediate.dense"].shard("bias", axis=0)
                layer["intermediate.dense"].sync("bwd_post", "all_reduce")
                layer["output.dense"].shard("weight", axis=1)             # row-parallel MLP out
                layer["output.dense"].sync("fwd_post", "all_reduce")
                layer.checkpoint()                                        # recompute in backward
    except VerifyError as e:
        return f"mismatch: {e}"
    return "verified: outputs and gradients equal the unscheduled model"


def main() -> int:
    from autoslapo.dist import spawn

    good = spawn(tp_bert, 2, True)[0]
    bad = spawn(tp_bert, 2, False)[0]
    print(f"correct schedule: {good}")
    print(f"missing all-reduce: {bad}")
    return 0 if good.startswith("verified") and bad.startswith("mismatch") else 1


if __name__ == "__main__":
    raise SystemExit(main())
