"""Is DeepSpeed's pipeline schedule the cause of the MT-NLG rows' optimism? (README, "Not done")

The cost model times a 1F1B pipeline as (m + p - 1) slots of a micro-batch's forward and backward
on the busiest stage (m micro-batches, p stages). MT-NLG 530B and BLOOM 176B ran on DeepSpeed's
pipeline engine (Megatron-DeepSpeed), whose ``TrainSchedule`` is a different program: 2 (m + p - 1)
steps a stage, each one forward or one backward (forward on a stage's even steps, its neighbours'
odd), with the sends of one step deferred to the next and every send and receive a blocking
``dist.send`` / ``dist.recv`` pair.

(a) Replays the installed DeepSpeed's own ``TrainSchedule`` instruction streams (every stage's) with
    those semantics (a send and its receive complete together, at the later of the two arrivals,
    plus a transfer time) and compares the makespan with the cost model's (m + p - 1) (tf + tb).
(b) Fits the three published MT-NLG iteration times (Smith et al. 2022: tp 8, pp 35, dp 8 / 10 /
    12, 1,920 sequences, micro-batch 1, so m = 240 / 192 / 160; read from the validation's held-out
    rows) with a slot time and a bubble of x slots, T = (m + x) * slot, and says which x they imply.

Usage: python experiments/deepspeed_schedule.py
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

HELDOUT = Path(__file__).resolve().parents[1] / "autoslapo" / "cost" / "data" / "a100_heldout_deepspeed.csv"
MTNLG = "smith2022_mtnlg_table"

Op = tuple[str, int]  # ("F" | "B", 0) or ("send" | "recv", peer stage)


def streams(micro_batches: int, stages: int) -> list[list[Op]]:
    """Each stage's operations, in order, from DeepSpeed's own ``TrainSchedule``."""
    from deepspeed.runtime.pipe import schedule as ds

    out: list[list[Op]] = []
    for s in range(stages):
        ops: list[Op] = []
        for step in ds.TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=s).steps():
            for cmd in step:
                if isinstance(cmd, ds.ForwardPass):
                    ops.append(("F", 0))
                elif isinstance(cmd, ds.BackwardPass):
                    ops.append(("B", 0))
                elif isinstance(cmd, ds.SendActivation):
                    ops.append(("send", s + 1))
                elif isinstance(cmd, ds.RecvActivation):
                    ops.append(("recv", s - 1))
                elif isinstance(cmd, ds.SendGrad):
                    ops.append(("send", s - 1))
                elif isinstance(cmd, ds.RecvGrad):
                    ops.append(("recv", s + 1))
        out.append(ops)
    return out


def makespan(stage_ops: list[list[Op]], tf: float, tb: float, transfer: float = 0.0) -> float:
    """When the last stage finishes: compute takes ``tf`` / ``tb``, a send and the peer's matching
    receive (the next unmatched one between the two stages) meet and take ``transfer``.
    Raises RuntimeError on a deadlock."""
    p = len(stage_ops)
    at = [0] * p
    clock = [0.0] * p
    while any(at[s] < len(stage_ops[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while at[s] < len(stage_ops[s]):
                kind, peer = stage_ops[s][at[s]]
                if kind in ("F", "B"):
                    clock[s] += tf if kind == "F" else tb
                    at[s] += 1
                    moved = True
                    continue
                want = ("recv" if kind == "send" else "send", s)
                if at[peer] < len(stage_ops[peer]) and stage_ops[peer][at[peer]] == want:
                    clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer
                    at[s] += 1
                    at[peer] += 1
                    moved = True
                    continue
                break
        if not moved:
            raise RuntimeError(f"the schedule deadlocks at operations {at}")
    return max(clock)


def mtnlg_rows(path: Path = HELDOUT) -> tuple[int, tuple[tuple[int, float], ...]]:
    """MT-NLG's pipeline stages and its rows as (micro-batches a pipeline, iteration seconds)."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == MTNLG and r["metric"] == "iteration_time_s"]
    stages = {int(r["pp"]) for r in rows}
    if not rows or len(stages) != 1:
        raise SystemExit(f"{path}: expected {MTNLG} rows of one pipeline depth, got {len(rows)} rows, depths {stages}")
    micro = [int(r["global_batch"]) // (int(r["dp"]) * int(json.loads(r["pinned"])["micro_batch"])) for r in rows]
    return stages.pop(), tuple((m, float(r["value"])) for m, r in zip(micro, rows, strict=True))


def fit_bubble(rows: tuple[tuple[int, float], ...]) -> tuple[float, float, float]:
    """Least squares of T = slot * m + slot * x over ``rows``: (slot s, bubble slots x, worst relative error)."""
    n = len(rows)
    mx = sum(m for m, _ in rows) / n
    my = sum(t for _, t in rows) / n
    slot = sum((m - mx) * (t - my) for m, t in rows) / sum((m - mx) ** 2 for m, _ in rows)
    x = (my - slot * mx) / slot
    worst = max(abs((m + x) * slot / t - 1) for m, t in rows)
    return slot, x, worst


def main() -> int:
    print("# (a) DeepSpeed's TrainSchedule replayed with blocking sends against the cost model's (m + p - 1)(tf + tb)")
    print(f"{'stages':>6} {'micro-batches':>13} {'tf':>4} {'tb':>4} {'DeepSpeed':>10} {'1F1B':>8}  ratio")
    for p, m in ((4, 8), (12, 128), (35, 160), (35, 240)):
        ops = streams(m, p)
        for tf, tb in ((1.0, 2.0), (1.0, 3.0)):
            got = makespan(ops, tf, tb)
            want = (m + p - 1) * (tf + tb)
            print(f"{p:>6} {m:>13} {tf:>4g} {tb:>4g} {got:>10.1f} {want:>8.1f}  {got / want:.4f}")
    stages, rows = mtnlg_rows()
    m0 = rows[0][0]
    ops = streams(m0, stages)
    extra = makespan(ops, 1.0, 3.0, 0.01) - makespan(ops, 1.0, 3.0)
    print(f"a transfer of t on every send adds {extra / 0.01 / (m0 + stages - 1):.2f} t a slot on the critical "
          f"path (pp {stages}, m {m0}): four sequential transfers where Megatron's batched send-and-receive has two")
    slot, x, worst = fit_bubble(rows)
    print(f"# (b) MT-NLG's {len(rows)} iteration times as (m + x) slots ({HELDOUT.name})")
    print(f"slot {slot * 1e3:.1f} ms, bubble {x:.1f} slots = {x / (stages - 1):.2f} (p - 1); worst row {worst:.1%}")
    fixed = [t / (m + stages - 1) * 1e3 for m, t in rows]
    print(f"with the 1F1B bubble of p - 1 = {stages - 1} slots the rows need slots of "
          + " / ".join(f"{v:.1f}" for v in fixed) + " ms (m = " + " / ".join(str(m) for m, _ in rows)
          + "): not one slot")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
