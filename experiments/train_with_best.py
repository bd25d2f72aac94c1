"""Example: tune a model, then train it with the best schedule the tuner found.

    python experiments/train_with_best.py                        # bert-tiny on 2 CPU ranks
    python experiments/train_with_best.py --backend sim --trials 20
    torchrun --nproc-per-node 8 experiments/train_with_best.py --model gpt2 --gpus 8 --gpu-type a100-80gb --skip-tune

Step 1 runs ``autoslapo tune`` (unless ``--skip-tune``); it records every trial in the store.
Step 2 trains: on every rank, ``autoslapo.apply_best`` looks the winner up and returns the model
scheduled with it and its engine; ``job.step(batch)`` runs one optimizer step the way the trials did
(or drive ``job.engine`` / ``job.pipeline`` yourself, as an ordinary DeepSpeed or pipeline loop).
Without torchrun the script launches its own ``--gpus`` local ranks (gloo on CPU).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def train(model: str, gpus: int, gpu_type: str | None, storage: str, steps: int, global_batch: int | None,
          lr: float) -> dict[str, Any]:
    """The training script proper: runs on every rank of the job."""
    import torch.distributed as dist

    import autoslapo.api as autoslapo  # the same functions as `import autoslapo` (best, apply_best)
    from autoslapo.models.build import example_batch

    job = autoslapo.apply_best(model, gpus=gpus, gpu_type=gpu_type, storage=storage, lr=lr)
    cfg = job.config
    batch_size = global_batch or cfg.global_batch
    losses = []
    for step in range(steps):
        # Stand-in data: random tokens of the model's vocabulary (swap in a real DataLoader).
        batch = example_batch(job.spec, batch_size, seed=1000 + step)
        # One optimizer step: this replica's rows through the engine (or the pipeline), exactly as
        # the tuner's trials ran them; the global batch's mean loss comes back on every rank.
        losses.append(job.step(batch))
        if dist.get_rank() == 0:
            print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    return {"rank": dist.get_rank(), "config": cfg.to_dict(), "losses": losses, "trial": job.trial.number,
            "study": job.trial.study, "measured": job.trial.measured}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tune a model, then train it with the best schedule")
    parser.add_argument("--model", default="bert-tiny")
    parser.add_argument("--gpus", type=int, default=2, help="ranks of the training job (and of each trial)")
    parser.add_argument("--gpu-type", default="cpu")
    parser.add_argument("--backend", default="local", choices=("sim", "local", "ray"))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="training steps after tuning")
    parser.add_argument("--global-batch", type=int, default=None, help="default: the tuned schedule's")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--storage", default=None, help="store URL (default: a temporary SQLite file)")
    parser.add_argument("--skip-tune", action="store_true", help="use what the store already holds")
    args = parser.parse_args(argv)

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Launched by torchrun (or Slurm): this process is one rank; tuning happened beforehand.
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        try:
            train(args.model, args.gpus, args.gpu_type, args.storage, args.steps, args.global_batch, args.lr)
        finally:
            dist.destroy_process_group()
        return 0

    with tempfile.TemporaryDirectory(prefix="autoslapo-example-") as tmp:
        storage = args.storage or f"sqlite:///{Path(tmp) / 'example.db'}"
        if not args.skip_tune:
            tune = ["tune", args.model, "--gpus", str(args.gpus), "--gpu-type", args.gpu_type,
                    "--backend", args.backend, "--trials", str(args.trials), "--storage", storage,
                    "--no-baselines"]
            print("$ autoslapo " + " ".join(tune), flush=True)
            # the command a user types, in its own process (the library does not import its CLI)
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
            code = subprocess.run([sys.executable, "-m", "autoslapo", *tune], check=False,
                                  env={**os.environ, "PYTHONPATH": path}).returncode
            if code:
                return code
        from autoslapo.dist import spawn

        print(f"training {args.model} on {args.gpus} local ranks with the best schedule", flush=True)
        results = spawn(train, args.gpus, args.model, args.gpus, args.gpu_type, storage, args.steps,
                        args.global_batch, args.lr, timeout=600.0)
    first = results[0]
    same = all(r["losses"] == first["losses"] for r in results)
    print(f"trained {len(first['losses'])} steps with trial {first['trial']} of {first['study']} "
          f"({'measured' if first['measured'] else 'estimated'}): {first['config']}")
    print(f"loss {first['losses'][0]:.4f} -> {first['losses'][-1]:.4f}; every rank agrees: {same}")
    return 0 if same and first["losses"][-1] < first["losses"][0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
