"""Does DeepSpeed's pipeline engine run a step in 1F1B's time or in lock-step? Measured on 2 CPU ranks.

DeepSpeed's ``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``) runs ``2 (m + p - 1)`` steps;
at each step even stages run a forward while odd stages run a backward, and neighbours exchange
activations and gradients with blocking ``send``/``recv`` at the start of every step. Where a send
completes only once its receiver has posted the matching receive (a rendezvous, which NCCL's send
of a message larger than its buffers is), every step lasts the longer of a forward and a backward,
so a micro-batch costs ``2 max(f, b)``: with full recomputation (``b = 3 f``) 1.5x the
``f + b`` of Megatron's 1F1B, about the gap between MT-NLG's DeepSpeed run and Megatron-LM's run of
the same model and layout. Where sends are buffered, only the data dependencies couple the stages
and the step takes 1F1B's ``(m + p - 1)(f + b)``.

This script measures which of the two DeepSpeed's engine gives on this machine's ranks (gloo): a
2-stage ``PipelineModule`` of linear blocks, 8 micro-batches a step, against ``f`` and ``b`` of one
stage measured alone on the same core. It cannot tell what NCCL does on GPUs.

    python experiments/pipeline_engine_cpu.py            # two shapes, ~2 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

SHAPES = [  # width, blocks a stage, micro-batch rows: a 1 MiB and an 8 MiB activation
    (1024, 8, 256),
    (2048, 2, 1024),
]
MICRO_BATCHES = 8


def rank_main(width: int, blocks: int, rows: int) -> None:
    import deepspeed
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule
    from torch import nn

    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = PipelineModule([LayerSpec(Block) for _ in range(2 * blocks)], num_stages=2, partition_method="uniform",
                         loss_fn=lambda out, y: ((out - y) ** 2).mean())
    config = {"train_batch_size": rows * MICRO_BATCHES, "train_micro_batch_size_per_gpu": rows,
              "steps_per_print": 10**9, "optimizer": {"type": "SGD", "params": {"lr": 1e-6}}}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=list(net.parameters()), config=config)
    x, y = torch.randn(rows, width), torch.randn(rows, width)
    batches = iter(lambda: (x, y), None)
    steps = []
    for _ in range(6):
        t0 = time.perf_counter()
        engine.train_batch(batches)
        steps.append(time.perf_counter() - t0)
    stage = nn.Sequential(*[Block() for _ in range(blocks)])  # one stage alone, one micro-batch
    xi = torch.randn(rows, width, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        out = stage(xi)
        fwd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out.sum().backward()
        bwd.append(time.perf_counter() - t0)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(json.dumps({"step": med(steps[2:]), "f": med(fwd[1:]), "b": med(bwd[1:])}), flush=True)


def run_shape(width: int, blocks: int, rows: int) -> dict[str, float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2",
           "MASTER_PORT": str(29500 + random.randrange(2000)), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(width), str(blocks), str(rows)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed (exit codes {[p.returncode for p in procs]})")
    got = [json.loads(line) for out in outs for line in out.splitlines() if line.startswith("{")]
    step = max(g["step"] for g in got)
    f, b = max(g["f"] for g in got), max(g["b"] for g in got)
    slots = MICRO_BATCHES + 2 - 1
    return {"step": step, "f": f, "b": b, "one_f_one_b": slots * (f + b), "lockstep": 2 * slots * max(f, b)}


def main() -> None:
    print(f"DeepSpeed pipeline engine, 2 stages on 2 CPU ranks (gloo), {MICRO_BATCHES} micro-batches a step")
    print(f"{'activation':>10} {'f (s)':>7} {'b (s)':>7} {'measured':>9} {'1F1B':>7} {'lock-step':>9}  closer to")
    for width, blocks, rows in SHAPES:
        r = run_shape(width, blocks, rows)
        closer = "1F1B" if abs(r["step"] - r["one_f_one_b"]) < abs(r["step"] - r["lockstep"]) else "lock-step"
        mib = rows * width * 4 / 2**20
        print(f"{mib:>7.0f} MiB {r['f']:7.3f} {r['b']:7.3f} {r['step']:9.2f} {r['one_f_one_b']:7.2f} "
              f"{r['lockstep']:9.2f}  {closer}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        rank_main(*map(int, sys.argv[2:]))
    else:
        main()
