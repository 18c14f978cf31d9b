"""A test that needs root and lacks it fails under CI=true rather than skipping: every such
check goes through `tests/needs.py` (`needs.root`), never a skip of its own."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def own_root_skips() -> list[str]:
    """Functions anywhere under tests/ that look at the effective uid and skip by themselves."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "needs.py":  # the one place that may
            continue
        source = path.read_text()
        if "geteuid" not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inside = list(ast.walk(node))
                if any(_is_geteuid(n) for n in inside) and any(_is_skip(n) for n in inside):
                    found.append(f"{path.relative_to(TESTS)}::{node.name}")
    return found


def _is_geteuid(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "geteuid"


def _is_skip(node: ast.AST) -> bool:
    """A call of `pytest.skip(...)` (not a mention of `pytest.skip.Exception`)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "skip"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "pytest"
    )


def test_no_test_skips_for_want_of_root_on_its_own() -> None:
    assert own_root_skips() == []
