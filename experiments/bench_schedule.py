"""Time to create and apply a full TP-8 schedule to a 24-layer BERT-large on the meta device.

Fake 8-rank process group in one process (rank 3 shown). Prints: model creation on meta, schedule
creation, applying TP to every layer's attention + MLP + the vocab-parallel embedding, and build
(materializing rank 3's shards from full per-module tensors on CPU).

    HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench_schedule.py | tee experiments/results/bench_schedule.txt
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import torch
    import torch.distributed as dist
    from transformers import BertConfig, BertModel

    from autoslapo import build, create_schedule
    from autoslapo.dist import init_fake_world
    from tests.autoslapo.test_tp import apply_tp_bert

    torch.set_num_threads(2)
    init_fake_world(8, rank=3)
    cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                     vocab_size=30528, max_position_embeddings=512)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = BertModel(cfg)
    t1 = time.perf_counter()
    sch = create_schedule(model, group=dist.group.WORLD)
    t2 = time.perf_counter()
    apply_tp_bert(sch)
    t3 = time.perf_counter()
    build(sch, seed=0)
    t4 = time.perf_counter()
    local = sum(p.numel() for p in model.parameters())
    print("BERT-large (24 layers, hidden 1024, 16 heads, vocab 30528), TP=8 on a fake group, rank 3")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"meta model creation     {t1 - t0:8.3f} s")
    print(f"create_schedule         {t2 - t1:8.3f} s  ({sum(1 for _ in sch.named_schedules())} nodes)")
    print(f"apply TP schedule       {t3 - t2:8.3f} s  ({sum(len(n.meta.get('shards', {})) for _, n in sch.named_schedules())} shards)")
    print(f"create + apply          {t3 - t1:8.3f} s")
    print(f"build (materialize)     {t4 - t3:8.3f} s  ({local / 1e6:.1f} M local parameters)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
