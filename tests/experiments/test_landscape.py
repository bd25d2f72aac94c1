"""The measured bert-tiny landscape replayed by ``bench_tuner.py`` and ``bench_prior.py``: its space
stays the one it was measured in, so random and grid search count only configurations that ran."""

from __future__ import annotations

import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
LANDSCAPE = EXPERIMENTS / "data" / "landscape_bert-tiny_4cpu.csv"


def test_the_measured_space_holds_every_measured_configuration_and_little_else() -> None:
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        from bench_tuner import measured_landscape
        from measure_landscape import SPACE
    finally:
        sys.path.remove(str(EXPERIMENTS))
    from search_spaces import space_from_dict

    model, cluster, table = measured_landscape(LANDSCAPE)
    configs = space_from_dict(SPACE).bind(model, cluster).configs()
    hashes = {c.config_hash() for c in configs}
    assert len(table) == 180 and set(table) <= hashes
    # knobs added after the measurement are pinned to what ran (the space held 924 configurations
    # when they were searched); what is left unmeasured is ZeRO-2 over pipeline stages, allowed since
    unmeasured = [c for c in configs if c.config_hash() not in table]
    assert len(unmeasured) <= 18 and all(c.zero_stage == 2 and c.pp > 1 for c in unmeasured)
    assert {(c.ckpt_granularity, c.loss_kernel) for c in configs} == {("full", "eager")}
