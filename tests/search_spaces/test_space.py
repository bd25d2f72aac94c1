"""Search spaces: every sampled point is valid or named invalid; domains are fixed; files are data."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoslapo import layout
from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import ModelSpec
from search_spaces import (
    SPACES,
    BoundSpace,
    Invalid,
    get_space,
    load_space,
    on_pace,
    space_for,
    space_from_dict,
)

CASES = [
    ("bert", ClusterSpec(gpus=64, gpu_type="a100-80gb")),
    ("bert-base", ClusterSpec(gpus=8, gpu_type="v100-16gb")),
    ("gpt2-xl", ClusterSpec(gpus=64, gpu_type="a100-80gb")),
    ("llama-70b", ClusterSpec(gpus=256, gpu_type="a100-80gb")),
    ("llama-tiny", ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)),
    ("bert-tiny", ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)),
    ("opt-1.3b", ClusterSpec(gpus=16, gpu_type="h100-80gb")),
]


def _bound(i: int) -> BoundSpace:
    name, cluster = CASES[i]
    spec = ModelSpec.from_name(name)
    return space_for(spec.family).bind(spec, cluster)


@st.composite
def points(draw: st.DrawFn) -> tuple[BoundSpace, dict]:
    b = _bound(draw(st.integers(0, len(CASES) - 1)))
    return b, {k: draw(st.sampled_from(v)) for k, v in b.domains.items()}


@settings(max_examples=300, deadline=None)
@given(points())
def test_every_sampled_point_is_a_valid_config_or_named_invalid(case: tuple[BoundSpace, dict]) -> None:
    b, point = case
    cfg = b.derive(point)
    if isinstance(cfg, Invalid):
        assert cfg.reason and "\n" not in cfg.reason
        return
    cfg.validate(b.model, b.cluster)  # raises if any rule is broken
    assert cfg.tp * cfg.pp * cfg.dp == b.cluster.gpus
    assert cfg.micro_batch * cfg.dp * cfg.grad_accum == b.global_batch
    assert b.model.heads % cfg.tp == 0 and b.model.kv_heads % cfg.tp == 0
    assert cfg.tp <= b.cluster.devices_per_node
    # uneven splits: each chunk holds a layer, but a transformer's first and last may hold only the
    # embeddings and the head
    assert cfg.pp * cfg.virtual_stages <= b.model.blocks + (2 if layout.empty_end_chunks_ok(b.model) else 0)
    # the canonical config is reachable from the space again
    assert b.params_of(cfg) is not None


@pytest.mark.parametrize("i", range(len(CASES)))
def test_domains_are_fixed_for_a_study(i: int) -> None:
    a, b = _bound(i), _bound(i)
    assert dict(a.domains) == dict(b.domains)
    assert all(len(v) >= 1 for v in a.domains.values())


def test_configs_are_distinct_and_valid() -> None:
    b = _bound(5)
    cfgs = b.configs()
    hashes = [c.config_hash() for c in cfgs]
    assert len(hashes) == len(set(hashes)) > 50
    for c in cfgs:
        assert isinstance(c, ScheduleConfig)
        c.validate(b.model, b.cluster)


def test_invalid_points_say_why() -> None:
    spec = ModelSpec.from_name("bert-tiny")
    b = get_space("bert").bind(spec, ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4), global_batch=8)
    bad = b.derive({**{k: v[0] for k, v in b.domains.items()}, "tp": 1, "pp": 1, "micro_batch": 64})
    assert isinstance(bad, Invalid) and "global batch" in bad.reason


def test_tp_stays_within_a_node_unless_the_space_allows_it() -> None:
    spec = ModelSpec.from_name("llama-70b")
    cluster = ClusterSpec(gpus=64, gpu_type="a100-80gb", gpus_per_node=4)
    assert max(get_space("llama").bind(spec, cluster).domains["tp"]) == 4
    d = get_space("llama").to_dict()
    d["rules"]["tp_within_node"] = False
    assert max(space_from_dict(d).bind(spec, cluster).domains["tp"]) == 8  # 8 key/value heads


def test_flash_dropped_where_the_device_has_none() -> None:
    spec = ModelSpec.from_name("bert-base")
    b = get_space("bert").bind(spec, ClusterSpec(gpus=8, gpu_type="v100-16gb"))
    assert "flash" not in b.domains["attn_kernel"]
    assert b.fixed["precision"] == "fp16"


def test_real_trials_fall_back_to_a_precision_the_runtime_trains_in() -> None:
    from autoslapo.errors import ConfigError
    from autoslapo.runtime.check import RUNTIME_PRECISIONS

    spec = ModelSpec.from_name("bert-base")
    v100 = ClusterSpec(gpus=8, gpu_type="v100-16gb")
    # the runtime trains fp16 (with its loss scaling): a V100's real trials keep it
    assert get_space("bert").bind(spec, v100, precisions=RUNTIME_PRECISIONS).fixed["precision"] == "fp16"
    # a runtime without fp16 would fall back to fp32
    no_fp16 = ("bf16", "fp32")
    assert get_space("bert").bind(spec, v100, precisions=no_fp16).fixed["precision"] == "fp32"
    a100 = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    assert "precision" not in get_space("bert").bind(spec, a100, precisions=RUNTIME_PRECISIONS).fixed
    d = get_space("bert").to_dict()
    d["knobs"]["precision"] = ["fp16", "bf16"]
    assert space_from_dict(d).bind(spec, a100, precisions=RUNTIME_PRECISIONS).domains["precision"] == ("fp16", "bf16")
    assert space_from_dict(d).bind(spec, a100, precisions=no_fp16).domains["precision"] == ("bf16",)
    with pytest.raises(ConfigError, match="no value of precision"):
        space_from_dict(d).bind(spec, v100, precisions=no_fp16)


def test_a_real_study_on_a_device_without_bf16_trains_in_fp16(tmp_path: Path) -> None:
    from store import open_store
    from tuner import StudyRunner, TuneOptions

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        spec, v100 = ModelSpec.from_name("bert-tiny"), ClusterSpec(gpus=2, gpu_type="v100-16gb")
        real = StudyRunner(TuneOptions(model=spec, cluster=v100, backend="local", trials=1), store)
        sim = StudyRunner(TuneOptions(model=spec, cluster=v100, backend="sim", trials=1, study="sim"), store)
        assert real.bound.fixed["precision"] == "fp16" and sim.bound.fixed["precision"] == "fp16"
    finally:
        store.close()


def test_round_trip_and_registry() -> None:
    for space in SPACES.values():
        assert space_from_dict(json.loads(json.dumps(space.to_dict()))) == space
    with pytest.raises(UsageError, match="valid spaces are"):
        get_space("bret")


def test_space_files_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "mine.toml"
    toml.write_text('name = "mine"\n[knobs]\ntp = [1, 2]\nmicro_batch = [1, 2, 4]\n[fixed]\nattn_kernel = "sdpa"\n')
    space = load_space(toml)
    spec = ModelSpec.from_name("bert-tiny")
    b = space.bind(spec, ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4))
    # Knobs declared after the first knob set (ckpt_granularity, loss_kernel) are searched unless fixed.
    # (not a convolutional family's knob, nor an RMSNorm family's: bert-tiny cannot use them)
    later = {k.name for k in KNOBS if k.since > 1 and k.sweep} - set(layout.inapplicable_knobs(spec, KNOBS))
    assert set(b.domains) == {"tp", "micro_batch", *later}
    assert all(c.attn_kernel == "sdpa" and c.pp == 1 for c in b.configs())
    js = tmp_path / "mine.json"
    js.write_text(json.dumps(space.to_dict()))
    assert load_space(js) == space


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('name = "x"\n[knobs]\ntpp = [1]\n', "unknown knob 'tpp'"),
        ('name = "x"\n[knobs]\ntp = [0, 2]\n', "tp must be a positive integer: got 0"),
        ('name = "x"\n[knobs]\nattn_kernel = ["fast"]\n', "attn_kernel must be one of"),
        ('name = "x"\n[knobs]\nckpt_ratio = [1.5]\n', "ckpt_ratio must be between 0 and 1"),
        ('name = "x"\nfoo = 1\n', "unknown key 'foo'"),
        ('name = "x"\n[knobs]\ntp = [1]\n[fixed]\ntp = 2\n', "either searched or fixed"),
        ('name = "x"\n[rules]\nmax_micro_batch = -1\n', "rules.max_micro_batch must be a positive integer"),
        ('name = "x"\n[knobs]\nzero_stage = "auto"\n', "only for tp, pp, micro_batch"),
        ('name = [\n', "valid TOML"),
    ],
)
def test_bad_space_files_give_one_line_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_space(p)
    assert "\n" not in str(info.value)


def test_space_file_is_never_executed(tmp_path: Path) -> None:
    p = tmp_path / "evil.json"
    p.write_text('{"name": "__import__(\'os\').system(\'touch pwned\')", "knobs": {"tp": [1]}}')
    load_space(p)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    with pytest.raises(UsageError, match=r"\.toml or \.json"):
        load_space(tmp_path / "space.py")


def test_search_spaces_import_is_pure() -> None:
    code = "import sys, search_spaces; bad=[m for m in ('optuna','ray','sqlalchemy','torch') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_on_pace_checks_the_deadline_and_reports_only_every_nth_item() -> None:
    ticks: list[tuple[int, int]] = []
    report = lambda done, total: ticks.append((done, total))  # noqa: E731
    passed = time.monotonic() - 1.0
    # between two checks nothing is looked at, not even a deadline already passed
    assert on_pace(3, 10, deadline=passed, tick=report, every=4)
    assert not on_pace(4, 10, deadline=passed, tick=report, every=4) and ticks == []  # stop, no report
    assert on_pace(8, 10, deadline=None, tick=report, every=4) and ticks == [(8, 10)]
    assert on_pace(8, 10, deadline=time.monotonic() + 60, tick=None, every=4)
