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


def pipeline_p2p_s(engine: str, m: int, pp: int, bubble: float, v: int, transfer_s: float, chunk_s: float) -> float:
    """Seconds of point-to-point transfers a step waits for: ``m`` micro-batches over ``pp`` stages
    of ``v`` chunks a rank, ``bubble`` fill-and-drain slots (``time.bubble_slots``), each transfer
    ``transfer_s`` and the shortest compute it could hide behind, one chunk's forward, ``chunk_s``.

    ``"megatron-core"``: Megatron-core as NeMo runs it with ``overlap_p2p_comm`` (NeMo's
    "Pipeline-parallel Communication Overlap", docs/source/features/optimizations/
    communication_overlap.rst): with virtual pipelining only, the sends and receives of the 1F1B
    phase (a forward and a backward chunk interleaved, ``2 m v`` transfers) run beside the
    computation of a chunk they do not feed, so only what a transfer takes beyond that chunk
    shows; the transfers of the pipeline's fill and drain stay exposed. Without virtual stages it
    exchanges as Megatron-LM does. The other engines put every transfer ``pipeline_transfers``
    counts on the path.
    """
    if pp <= 1:
        return 0.0
    if engine == "megatron-core" and v > 1:
        return 2.0 * bubble * v * transfer_s + 2.0 * m * v * max(transfer_s - chunk_s, 0.0)
    return pipeline_transfers(engine, m, pp, (m + bubble) * v) * transfer_s
