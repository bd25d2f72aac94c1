"""Point-to-point time a step waits for, by pipeline engine (``autoslapo.cost.p2p.pipeline_p2p_s``)."""

from __future__ import annotations

import pytest

from autoslapo.cost.p2p import pipeline_p2p_s, pipeline_transfers


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "megatron-core"])
def test_no_pipeline_waits_on_no_transfer(engine: str) -> None:
    assert pipeline_p2p_s(engine, m=8, pp=1, bubble=0.0, v=1, transfer_s=1.0, chunk_s=0.1) == 0.0


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_blocking_engines_put_every_counted_transfer_on_the_path(engine: str) -> None:
    got = pipeline_p2p_s(engine, m=16, pp=4, bubble=1.5, v=2, transfer_s=0.003, chunk_s=1.0)
    assert got == pytest.approx(pipeline_transfers(engine, 16, 4, (16 + 1.5) * 2) * 0.003)


def test_megatron_core_without_virtual_stages_exchanges_as_megatron_does() -> None:
    """NeMo overlaps pipeline transfers only with virtual pipelining."""
    assert (pipeline_p2p_s("megatron-core", m=16, pp=4, bubble=3.0, v=1, transfer_s=0.002, chunk_s=1.0)
            == pipeline_p2p_s("megatron", m=16, pp=4, bubble=3.0, v=1, transfer_s=0.002, chunk_s=1.0))


def test_megatron_core_hides_the_1f1b_phases_transfers_behind_a_chunk_and_exposes_fill_and_drain() -> None:
    m, pp, v = 64, 8, 12
    bubble = (pp - 1) / v
    short = pipeline_p2p_s("megatron-core", m=m, pp=pp, bubble=bubble, v=v, transfer_s=0.001, chunk_s=0.01)
    assert short == pytest.approx(2 * bubble * v * 0.001)  # the fill's and the drain's: 2 (pp - 1) transfers
    long = pipeline_p2p_s("megatron-core", m=m, pp=pp, bubble=bubble, v=v, transfer_s=0.015, chunk_s=0.01)
    assert long == pytest.approx(2 * bubble * v * 0.015 + 2 * m * v * 0.005)  # what a transfer takes beyond its chunk
    blocking = pipeline_p2p_s("megatron", m=m, pp=pp, bubble=bubble, v=v, transfer_s=0.015, chunk_s=0.01)
    assert short < long < blocking
