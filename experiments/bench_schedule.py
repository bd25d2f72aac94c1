"""Time to create and apply a full TP-8 schedule to a 24-layer BERT-large on the meta device.

Fake 8-rank process group in one process (rank 3 shown). The model is ``build_model("bert-large")``
(BertForMaskedLM from a transformers config) created on the meta device, and the schedule is the
family schedule of ``autoslapo.plan.apply_schedule`` with ``ScheduleConfig(tp=8)``: every layer's
attention and MLP column/row-parallel with their collectives (the vocabulary, 30522, does not divide
by 8, so the plan keeps the embedding replicated). Prints model creation on meta, schedule creation,
applying the schedule, and ``build`` for one rank (materializing rank 3's shards from full
per-module tensors on CPU, same values as the unscheduled model).

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

    from autoslapo import build, create_schedule
    from autoslapo.config import ScheduleConfig
    from autoslapo.dist import init_fake_world
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec
    from autoslapo.plan import apply_schedule

    torch.set_num_threads(2)
    init_fake_world(8, rank=3)
    spec = ModelSpec.from_name("bert-large")
    config = ScheduleConfig(tp=8)
    build_model(ModelSpec.from_name("bert-tiny"), device="meta")  # warm transformers' lazy imports
    t0 = time.perf_counter()
    model = build_model(spec, device="meta")
    t1 = time.perf_counter()
    sch = create_schedule(model, group=dist.group.WORLD)
    t2 = time.perf_counter()
    apply_schedule(sch, spec, config)
    t3 = time.perf_counter()
    build(sch, seed=0)
    t4 = time.perf_counter()
    local = sum(p.numel() for p in model.parameters())
    shards = sum(len(n.meta.get("shards", {})) for _, n in sch.named_schedules())
    print(f"BERT-large ({type(model).__name__}, {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads, "
          f"vocab {spec.vocab}): apply_schedule(ScheduleConfig(tp=8)) on a fake group, rank 3")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    print(f"meta model creation     {t1 - t0:8.3f} s")
    print(f"create_schedule         {t2 - t1:8.3f} s  ({sum(1 for _ in sch.named_schedules())} nodes)")
    print(f"apply_schedule          {t3 - t2:8.3f} s  ({shards} shards; skipped: {sch.meta['plan']['skipped']})")
    print(f"create + apply          {t3 - t1:8.3f} s")
    print(f"build (rank 3)          {t4 - t3:8.3f} s  ({local / 1e6:.1f} M local parameters)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
