"""The docs that make promises are checked: the requirements map, the roadmap boundary and
the job kinds."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from moonrun.run.handlers import load_handlers

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
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
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


def test_the_testing_notes_name_only_tests_that_exist() -> None:
    """Every `tests/file.py::test_name` in docs/testing.md is a real test function."""
    text = (ROOT / "docs" / "testing.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
    assert named, "docs/testing.md names no tests"
    missing = {
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / file).exists() or name not in test_function_names(ROOT / file)
    }
    assert set() == missing


def test_every_spec_scenario_is_in_the_requirements_map() -> None:
    """Each of the spec's 23 scenarios has a row naming a test of the scenario's own name."""
    text = (ROOT / "docs" / "requirements.md").read_text()
    rows = re.findall(r"^\| ([A-Z][^|]+?) \| (.+) \|$", text, flags=re.MULTILINE)
    rows = [(scenario, tests) for scenario, tests in rows if scenario != "scenario"]
    assert len(rows) == 23
    unnamed = [
        scenario
        for scenario, tests in rows
        if "::test_"
        + re.sub(r"[^a-z0-9]+", "_", scenario.lower().replace("'", "")).strip("_")
        + "`"
        not in tests
    ]
    assert unnamed == []


def test_completion_is_reported() -> None:
    """The roadmap names every capability the spec keeps out of this change as later work."""
    text = (ROOT / "docs" / "roadmap.md").read_text().lower()
    assert "does **not** claim production readiness" in text
    assert [item for item in BOUNDARY if item not in text] == []


def payload_fields(handler: object) -> set[str]:
    """The keys a handler class reads with `.get("key")`: its payload's fields."""
    tree = ast.parse(inspect.getsource(type(handler)))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def kind_sections() -> dict[str, str]:
    """docs/kinds.md's `## name` sections by name."""
    text = (ROOT / "docs" / "kinds.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_handler_is_documented_in_kinds_md() -> None:
    """Each kind Run loads has a `## kind` section in docs/kinds.md naming every payload field."""
    sections = kind_sections()
    handlers = load_handlers()
    assert {"command", "sleep", "noop"} - set(handlers) == set()
    missing = {
        kind: sorted(payload_fields(handler) - set(re.findall(r"`(\w+)`", sections.get(kind, ""))))
        for kind, handler in handlers.items()
    }
    undocumented = {
        kind: fields for kind, fields in missing.items() if kind not in sections or fields
    }
    assert undocumented == {}
