"""The schedule tree, the primitive registry, replace, annotate."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

import autoslapo
import autoslapo.schedule as schedule_mod
from autoslapo import create_schedule, list_primitives
from autoslapo.errors import ScheduleError
from autoslapo.schedule import register_primitive
from tests.conftest import tiny_bert, tiny_mlp

ROOT = Path(__file__).resolve().parents[2]


def test_tree_paths_and_lookup() -> None:
    model = tiny_bert()
    sch = create_schedule(model)
    assert [p for p, _ in sch.named_schedules()] == [p for p, _ in model.named_modules()]
    node = sch["encoder.layer.0.attention.self.query"]
    assert node.mod is model.encoder.layer[0].attention.self.query and node.name == "query"
    assert sch["encoder"]["layer.1"] is sch["encoder.layer.1"] and node.root() is sch
    assert "encoder.layer.1.output" in sch and "encoder.layer.9" not in sch
    assert (sch.group_size, sch.rank, sch.group) == (1, 0, None)
    with pytest.raises(ScheduleError, match=r"did you mean 'encoder.layer.0.attention"):
        sch["encoder.layer.0.atention"]
    with pytest.raises(AttributeError, match=r"primitives: .*shard"):
        sch.no_such_primitive  # noqa: B018


def test_registry() -> None:
    names = list_primitives()
    assert names == sorted(names)
    for name in ("replace", "replace_all", "shard", "sync", "checkpoint", "fork_rng", "annotate"):
        assert name in names

    @register_primitive("test_only_noop")
    def noop(sch: autoslapo.Schedule, x: int) -> int:
        return x + len(sch.children)

    try:
        assert create_schedule(tiny_mlp())["1"].test_only_noop(1) == 1
        with pytest.raises(ScheduleError, match="already registered"):
            register_primitive("test_only_noop")(lambda sch: None)
    finally:
        schedule_mod._PRIMITIVES.pop("test_only_noop")
        delattr(autoslapo.Schedule, "test_only_noop")
    with pytest.raises(ScheduleError, match="clashes"):
        register_primitive("refresh")(lambda sch: None)


def test_replace_and_replace_all_keep_paths() -> None:
    model = tiny_mlp()
    sch = create_schedule(model)
    node = sch["1"].replace(nn.Sequential(nn.Linear(16, 32)))
    assert model[1] is node.mod and "1.0" in sch and sch["1.0"].path == "1.0"
    done = sch.replace_all(nn.Linear, lambda old: nn.Linear(old.in_features, old.out_features, bias=False))
    assert done == ["0", "1.0", "3"]
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    assert model(torch.randn(2, 16)).shape == (2, 16)
    with pytest.raises(ScheduleError, match=r"needs an nn.Module"):
        sch["0"].replace(3)


def test_annotate() -> None:
    sch = create_schedule(tiny_mlp())
    sch["1"].annotate("weight", "zero_stage", 3)
    sch["1"].shard("weight", 0)
    assert sch["1"].mod.weight._autoslapo_annotations == {"zero_stage": 3}  # survives shard
    assert sch["1"].meta["annotations"]["weight"] == {"zero_stage": 3}
    with pytest.raises(ScheduleError, match="no parameter 'w'"):
        sch["1"].annotate("w", "k", 1)


def test_import_autoslapo_is_light() -> None:
    code = (
        "import sys, autoslapo; print('torch' in sys.modules, 'transformers' in sys.modules); "
        "import autoslapo.schedule; print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the schedule language needs torch, but transformers only when a model uses it
    assert out.stdout.split() == ["False", "False", "False"]


def test_unknown_primitive_names_the_closest() -> None:
    sch = create_schedule(tiny_mlp())
    name = "shrad"  # looked up dynamically, as a config-driven caller would
    with pytest.raises(AttributeError, match=r"did you mean 'shard'\?"):
        getattr(sch, name)
    with pytest.raises(ScheduleError, match=r"did you mean 'shard'\?"):
        schedule_mod.get_primitive(name)
    assert schedule_mod.get_primitive("shard") is autoslapo.Schedule.shard


@pytest.mark.slow
def test_misspelled_primitive_fails_mypy(tmp_path: Path) -> None:
    # Schedule declares its primitives, so a type checker knows them; no __getattr__ -> Any hides a typo.
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from torch import nn\n\nfrom autoslapo.schedule import create_schedule\n\n"
        "sch = create_schedule(nn.Linear(2, 2))\n"
        "sch.shard('weight', 0)\n"
        "sch.shrad('weight', 0)\n"
    )
    # a cache outside the work tree: the first run reads torch's annotations (~25 s), later ones ~1 s
    cache = Path(tempfile.gettempdir()) / "autoslapo-test-mypy-cache"
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
         "--no-error-summary", str(snippet)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, out.stdout + out.stderr
    assert 'snippet.py:7: error: "Schedule" has no attribute "shrad"; maybe "shard"?' in errors[0]


def test_schedule_imports_without_a_cycle() -> None:
    # Each primitive module imports on its own without pulling the schedule in (Schedule is a
    # type-checking import there), and the schedule imports cleanly with warnings as errors.
    from autoslapo import primitives

    mods = sorted(m.name for m in pkgutil.iter_modules(primitives.__path__))
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module('autoslapo.primitives.' + m)\n"
        "    assert 'autoslapo.schedule' not in sys.modules, m\n"
        "import autoslapo.schedule\n"
        "print(len(autoslapo.schedule.list_primitives()))\n"
    )
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert int(out.stdout) == len(list_primitives())
