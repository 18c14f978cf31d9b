"""The import rules of the architecture: the domain stays pure, layers point downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "moonrun"

# Modules that do I/O, read clocks or draw random numbers; the domain may import none.
IMPURE_MODULES = {
    "asyncio",
    "io",
    "os",
    "pathlib",
    "random",
    "secrets",
    "shutil",
    "socket",
    "sqlite3",
    "subprocess",
    "threading",
    "time",
    "urllib",
    "uuid",
    "logging",
    "tempfile",
}
IMPURE_CALLS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "urandom"}

LAYER_RULES = {
    "scheduling": {
        "moonrun.store",
        "moonrun.platform",
        "moonrun.run",
        "moonrun.clock",
        "moonrun.security",
        "moonrun.cli",
        "moonrun.settings",
    },
    "store": {"moonrun.platform", "moonrun.run", "moonrun.cli", "moonrun.settings"},
    "security": {"moonrun.platform", "moonrun.run", "moonrun.store", "moonrun.cli"},
    "run": {"moonrun.platform", "moonrun.store", "moonrun.cli", "moonrun.settings"},
    "client": {
        "moonrun.platform",
        "moonrun.store",
        "moonrun.run",
        "moonrun.cli",
        "moonrun.settings",
        "moonrun.scheduling",
        "moonrun.security",
    },
    # The user CLI is a client of the API like any other: it reaches the platform through
    # moonrun.client only.
    "usercli": {
        "moonrun.platform",
        "moonrun.store",
        "moonrun.run",
        "moonrun.cli",
        "moonrun.settings",
        "moonrun.scheduling",
        "moonrun.security",
    },
    "userconfig": {
        "moonrun.platform",
        "moonrun.store",
        "moonrun.run",
        "moonrun.cli",
        "moonrun.settings",
        "moonrun.client",
    },
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules_of(package: str) -> list[Path]:
    """The modules of a package, or the one module of that name."""
    module = SRC / f"{package}.py"
    return [module] if module.exists() else sorted((SRC / package).rglob("*.py"))


def test_scheduling_imports_no_io_clock_or_randomness() -> None:
    """`moonrun.scheduling` is pure: no I/O, clock or randomness modules."""
    offenders = {
        f"{path.name}: {name}"
        for path in modules_of("scheduling")
        for name in imports_of(path)
        if name.split(".")[0] in IMPURE_MODULES
    }
    assert set() == offenders


def test_scheduling_never_reads_the_clock() -> None:
    """Even through `datetime`, the domain never asks what time it is."""
    offenders = set()
    for path in modules_of("scheduling"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in IMPURE_CALLS
            ):
                offenders.add(f"{path.name}:{node.lineno} .{node.func.attr}()")
    assert set() == offenders


@pytest.mark.parametrize("package", sorted(LAYER_RULES))
def test_layers_import_only_downwards(package: str) -> None:
    """Each layer imports nothing from the layers above it (DESIGN.md, "Layers")."""
    modules = modules_of(package)
    assert modules, f"no modules found for {package}"
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in modules
        for name in imports_of(path)
        for banned in LAYER_RULES[package]
        if name == banned or name.startswith(banned + ".")
    }
    assert set() == offenders


def test_the_import_checker_sees_violations(tmp_path: Path) -> None:
    """The checker itself flags a forbidden import (so a green run means something)."""
    module = tmp_path / "bad.py"
    module.write_text("import time\nfrom moonrun.store.memory import MemoryStore\n")
    assert {"time", "moonrun.store.memory"} == imports_of(module)
