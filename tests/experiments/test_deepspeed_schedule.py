"""``experiments/deepspeed_schedule.py``: DeepSpeed's own TrainSchedule, replayed with blocking sends,
takes the cost model's 1F1B time; the bubble fit recovers a planted bubble."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture(scope="module")
def sched():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import deepspeed_schedule
    finally:
        sys.path.remove(str(EXPERIMENTS))
    return deepspeed_schedule


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 3), (4, 8), (5, 7)])
def test_deepspeeds_train_schedule_takes_the_1f1b_time(sched, stages: int, micro_batches: int) -> None:  # type: ignore[no-untyped-def]
    ops = sched.streams(micro_batches, stages)
    assert sum(op == ("F", 0) for s in ops for op in s) == stages * micro_batches
    for tf, tb in ((1.0, 2.0), (1.0, 3.0), (2.0, 2.5)):
        assert sched.makespan(ops, tf, tb) == pytest.approx((micro_batches + stages - 1) * (tf + tb))
    # transfers lie on the critical path: the same schedule with them is slower
    assert sched.makespan(ops, 1.0, 2.0, 0.1) > sched.makespan(ops, 1.0, 2.0)


def test_a_deadlocked_schedule_is_named(sched) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match="deadlocks"):
        sched.makespan([[("recv", 1)], [("recv", 0)]], 1.0, 2.0)


def test_the_bubble_fit_recovers_a_planted_bubble(sched) -> None:  # type: ignore[no-untyped-def]
    rows = tuple((m, (m + 50.0) * 0.2) for m in (240, 192, 160))
    slot, x, worst = sched.fit_bubble(rows)
    assert slot == pytest.approx(0.2) and x == pytest.approx(50.0) and worst < 1e-9


def test_mtnlgs_rows_come_from_the_validations_held_out_data(sched) -> None:  # type: ignore[no-untyped-def]
    stages, rows = sched.mtnlg_rows()
    assert stages == 35 and [m for m, _ in rows] == [240, 192, 160]
    slot, x, worst = sched.fit_bubble(rows)
    assert 0.19 < slot < 0.2 and 60 < x < 70 and worst < 0.01


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (2, 9), (3, 1), (3, 2), (4, 8), (7, 5), (12, 16), (35, 40)])
def test_the_cost_models_deepspeed_transfers_are_the_replays(sched, stages: int, micro_batches: int) -> None:  # type: ignore[no-untyped-def]
    """``autoslapo.cost.p2p.pipeline_transfers`` for DeepSpeed's engine counts the transfers the replay of its
    TrainSchedule puts on the critical path; Megatron's batched exchange puts two a slot."""
    from autoslapo.cost.p2p import pipeline_transfers

    ops = sched.streams(micro_batches, stages)
    t = 1e-3  # small beside the compute, so the critical path keeps its shape
    replayed = (sched.makespan(ops, 1.0, 3.0, t) - sched.makespan(ops, 1.0, 3.0)) / t
    slots = micro_batches + stages - 1
    assert pipeline_transfers("deepspeed", micro_batches, stages, slots) == pytest.approx(replayed, abs=1e-6)
    assert pipeline_transfers("megatron", micro_batches, stages, slots) == 2 * slots
    if stages >= 3 and micro_batches >= 2:  # a micro-batch more: four transfers more, Megatron's two
        more = pipeline_transfers("deepspeed", micro_batches + 1, stages, slots + 1)
        assert more - pipeline_transfers("deepspeed", micro_batches, stages, slots) == 4
