"""The docs that make promises are checked: the requirements map and the roadmap boundary."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUNDARY = [
    "process supervision",
    "real config/file execution",
    "durable log/artifact/metric/backup storage",
    "dependency installation",
    "run self-update",
    "client-manager lifecycle",
    "production multi-replica scaling",
]


def test_function_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


test_function_names.__test__ = False  # type: ignore[attr-defined]


def test_requirements_map_names_only_tests_that_exist() -> None:
    """Every `tests/file.py::test_name` in docs/requirements.md is a real test function."""
    text = (ROOT / "docs" / "requirements.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
    assert named, "the requirements map names no tests"
    missing = {
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / file).exists() or name not in test_function_names(ROOT / file)
    }
    assert set() == missing


def test_every_spec_scenario_is_in_the_requirements_map() -> None:
    """Each scenario of the spec has a row, and each service-level one a same-named test."""
    text = (ROOT / "docs" / "requirements.md").read_text()
    scenarios = re.findall(r"^\| ([A-Z][^|]+?) \| ", text, flags=re.MULTILINE)
    scenarios = [s for s in scenarios if s != "scenario"]
    assert len(scenarios) == 23
    scenario_tests = test_function_names(ROOT / "tests" / "test_scenarios.py")
    pending = {"Artifact transfer blocks", "Log ingest blocks", "Completion is reported"}
    expected = {
        "test_" + re.sub(r"[^a-z0-9]+", "_", s.lower().replace("'", "")).strip("_")
        for s in scenarios
        if s not in pending
    }
    assert set() == expected - scenario_tests


def test_completion_is_reported() -> None:
    """The roadmap names every capability the spec keeps out of this change as later work."""
    text = (ROOT / "docs" / "roadmap.md").read_text().lower()
    assert "does **not** claim production readiness" in text
    assert [item for item in BOUNDARY if item not in text] == []
