"""Imports point down, read from the source with ``ast`` (module- and function-level imports alike).

* the cost model is pure: nothing under ``autoslapo/cost/`` imports ``autoslapo.runtime``;
* the library never imports its CLI: nothing outside ``autoslapo/cli/`` imports ``autoslapo.cli``
  (but the ``python -m autoslapo`` entry point);
* modules stay a few hundred lines: none in the packages is over 500.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("autoslapo", "tuner", "store", "search_spaces")
MAX_LINES = 500
# Importers of the CLI that are the CLI's callers, not the library's parts.
CLI_CALLERS = {
    "autoslapo/__main__.py": "the `python -m autoslapo` entry point",
    "experiments/fault_injection.py": "drives the bad-input corpus through the CLI in-process, as tests/hardening does",
}


def _modules(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path, package: tuple[str, ...] | None = None) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in the file: ``(line, dotted name)``.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a submodule); a relative
    import is resolved against the file's package (default: its folder under the repository);
    ``importlib.import_module("x")`` and ``__import__("x")`` with a literal name count too.
    """
    if package is None:
        package = path.relative_to(ROOT).parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = list(package[: len(package) - (node.level - 1)])
                base = ".".join([*parent, *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _offences(paths: list[Path], forbidden: str) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {name}"
            for p in paths for line, name in imported_modules(p) if _within(name, forbidden)]


def test_scanner_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    # the scanner itself must see what the rules forbid, or the rules below pass vacuously
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\n\ndef f():\n    from ..runtime import run_trial\n    import importlib\n"
                     "    importlib.import_module('autoslapo.runtime.train')\n")
    found = [(line, n) for line, n in imported_modules(probe, ("autoslapo", "cost")) if _within(n, "autoslapo.runtime")]
    assert found == [(5, "autoslapo.runtime"), (5, "autoslapo.runtime.run_trial"), (7, "autoslapo.runtime.train")]
    names = {n for _, n in imported_modules(ROOT / "autoslapo" / "cost" / "__init__.py")}
    assert "autoslapo.cost.estimate" in names and "autoslapo.cost.estimate.estimate" in names


def test_cost_model_imports_no_runtime() -> None:
    offences = _offences(_modules("autoslapo/cost"), "autoslapo.runtime")
    assert not offences, "the cost model is pure; measure beside the runtime instead:\n" + "\n".join(offences)


def test_only_the_cli_imports_the_cli() -> None:
    cli = ROOT / "autoslapo" / "cli"
    paths = [p for p in _modules(*PACKAGES, "experiments")
             if cli not in p.parents and str(p.relative_to(ROOT)) not in CLI_CALLERS]
    offences = _offences(paths, "autoslapo.cli")
    assert not offences, "the library must not import its CLI; move the shared code below it:\n" + "\n".join(offences)
    for caller in CLI_CALLERS:  # the exceptions are real files that do import the CLI
        assert _offences([ROOT / caller], "autoslapo.cli"), caller


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_500_lines(package: str) -> None:
    sizes = {p: len(p.read_text().splitlines()) for p in _modules(package)}
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p, n in sorted(sizes.items()) if n > MAX_LINES]
    assert sizes, f"no modules found under {package}/"
    assert not big, f"modules over {MAX_LINES} lines; split them by theme:\n" + "\n".join(big)
