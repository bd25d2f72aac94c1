"""Point-to-point transfers a pipeline engine puts on a step's critical path. Pure.

Each transfer is one stage's activation or its gradient (``autoslapo.cost.time`` prices it from
the link between the stages); the engines differ in how many of them the step waits for.
"""

from __future__ import annotations


def pipeline_transfers(engine: str, m: int, pp: int, slots: float) -> float:
    """Point-to-point transfers on a step's critical path, each the time of one stage's activation
    (or its gradient), with ``m`` micro-batches over ``pp`` stages and ``slots`` pipeline slots.

    Megatron-LM's 1F1B exchanges an activation and a gradient in one batched send-and-receive a
    slot: 2 a slot, bubble included (autoslapo's runtime, ``torch.distributed.pipelining``, too).
    DeepSpeed's ``PipelineEngine`` runs its ``TrainSchedule`` with a blocking send or receive for
    each activation and gradient: replayed instruction by instruction (``experiments/
    deepspeed_schedule.py``, every stage's stream of the installed DeepSpeed, a send meeting its
    receive), its critical path holds ``4 m + 2 (pp - 4)`` transfers for pp >= 3 and m >= 2 (2 m
    for two stages, 2 (pp - 1) for one micro-batch): four a micro-batch, twice Megatron's
    (``tests/experiments/test_deepspeed_schedule.py`` checks this count against the replay).
    """
    if pp <= 1:
        return 0.0
    if engine != "deepspeed":
        return 2.0 * slots
    if pp == 2:
        return 2.0 * m
    if m == 1:
        return 2.0 * (pp - 1)
    return 4.0 * m + 2.0 * (pp - 4)
