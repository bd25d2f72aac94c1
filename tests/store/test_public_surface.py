"""The store is used through ``store/__init__.py`` only: no code outside it imports ``store._*``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import store

ROOT = Path(__file__).resolve().parents[2]
# Every package and script that uses the store; tests/store may reach inside (migrations, schema).
SCANNED = ("autoslapo", "tuner", "search_spaces", "experiments", "scripts", "tests")
ALLOWED = (ROOT / "tests" / "store",)


def _imported(node: ast.AST) -> list[str]:
    """The module names ``node`` imports (``import``, ``from``, ``import_module("...")``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        submodules = [f"store.{a.name}" for a in node.names] if node.module == "store" else []
        return [node.module, *submodules]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if func in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def private_store_imports(source: str, filename: str = "<source>") -> list[str]:
    """``line: statement`` for each import of a private ``store._*`` module in ``source``."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source, filename))
        if any(name.startswith("store._") for name in _imported(node))
    ]


def _sources() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if ".venv" in path.parts or any(path.is_relative_to(a) for a in ALLOWED):
                continue
            files.append(path)
    return files


def test_no_module_outside_the_store_imports_its_private_modules() -> None:
    files = _sources()
    assert len(files) > 50, "the scan must see the project's sources"
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in files
        if (hits := private_store_imports(path.read_text(encoding="utf-8"), str(path)))
    }
    assert offenders == {}, (
        "use the store through `from store import ...` (export what is missing from store/__init__.py): "
        f"{offenders}"
    )


@pytest.mark.parametrize(
    "source",
    [
        "from store._url import parse_url",
        "import store._engine",
        "import store._engine as engine",
        "from store import _trials",
        "def f():\n    from store._records import StudyRecord",
        "import importlib\nimportlib.import_module('store._schema')",
    ],
)
def test_the_scan_catches_private_imports(source: str) -> None:
    assert private_store_imports(source) != []


@pytest.mark.parametrize(
    "source",
    ["from store import Store, open_store", "import store", "from stores._x import y", "import storex._y"],
)
def test_the_scan_allows_public_imports(source: str) -> None:
    assert private_store_imports(source) == []


def test_every_exported_name_exists() -> None:
    assert all(hasattr(store, name) for name in store.__all__)
    assert not [name for name in store.__all__ if name.startswith("_")]
