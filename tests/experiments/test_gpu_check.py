"""``experiments/gpu_check.py``'s fused-attention timing, in its CPU dry-run form (the logic a lent GPU runs)."""

from __future__ import annotations

import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def test_the_attention_check_times_every_shape_beside_the_cost_models_prediction() -> None:
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        from gpu_check import ATTENTION_SHAPES, check_attention
    finally:
        sys.path.remove(str(EXPERIMENTS))
    lines = check_attention(True, "cpu", repeats=1)
    rows = lines[2:]
    assert "predicted for a100-80gb" in lines[0] and "logic check only" in lines[0]
    assert len(rows) == len(ATTENTION_SHAPES["cpu"])
    for (b, h, s, d), row in zip(ATTENTION_SHAPES["cpu"], rows, strict=True):
        shape, predicted, measured, error = row.rsplit(None, 3)
        assert shape.split() == [str(b), "x", str(h), "x", str(s), "x", str(d)]
        assert float(predicted) > 0 and float(measured) > 0 and error == "-"
