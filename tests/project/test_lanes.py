"""The lanes of `make test` (docs/testing.md, "How make test runs") are the folders: every
test in tests/process/ is marked `processes` (the real-process lane, the real clock), no test
elsewhere is, and no test elsewhere asserts how long something took. In tests/process/, a test
that asserts how long something took is marked `alone` (on the test or its module), so that no
other real-process test runs beside it.

The parallel lane runs niced beside the real-process one on a shared machine, where a step that
takes 0.1 s alone can take 2 s: its tests measure no durations (a manual clock drives time, or
the test counts and orders events). A bound that only stops a wait for something that must
happen (a hang guard, `time.monotonic() < deadline`) is not a duration and is allowed. The
scan reads each file's syntax: it finds an assertion on a difference of clock readings, made
inline or kept in a variable first; a duration measured in a helper and returned is beyond it
(those tests, like the ones comparing latencies, are marked `alone` by hand).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SERIAL = TESTS / "process"
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}


def reads_a_clock(node: ast.AST, readings: set[str]) -> bool:
    """Whether the expression calls a wall clock (`time.monotonic()`, `perf_counter()`, ...)
    or uses a variable that holds a reading."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            func = inner.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CLOCKS:
                return True
        if isinstance(inner, ast.Name) and inner.id in readings:
            return True
    return False


def is_duration(node: ast.AST, readings: set[str], durations: set[str]) -> bool:
    """A difference of clock readings, or a variable that holds one."""
    if isinstance(node, ast.Name):
        return node.id in durations
    return any(
        isinstance(inner, ast.BinOp)
        and isinstance(inner.op, ast.Sub)
        and reads_a_clock(inner, readings)
        for inner in ast.walk(node)
    )


def timed_assertions(source: str) -> list[int]:
    """The lines of `assert`s that compare a measured duration with anything."""
    found: list[int] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        readings: set[str] = set()
        durations: set[str] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {target.id for target in targets if isinstance(target, ast.Name)}
                if is_duration(node.value, readings, durations):
                    durations |= names
                elif reads_a_clock(node.value, readings):
                    readings |= names
        for node in ast.walk(function):
            if isinstance(node, ast.Assert):
                compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)]
                if any(
                    is_duration(side, readings, durations)
                    for compare in compares
                    for side in [compare.left, *compare.comparators]
                ):
                    found.append(node.lineno)
    return found


def parallel_lane_files() -> list[Path]:
    return [path for path in sorted(TESTS.rglob("*.py")) if SERIAL not in path.parents]


def marks_the_module(tree: ast.Module, mark: str) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and f"mark.{mark}" in ast.unparse(node.value)
        for node in tree.body
    )


def marks_the_module_processes(tree: ast.Module) -> bool:
    return marks_the_module(tree, "processes")


def timed_but_not_alone(source: str) -> list[str]:
    """The functions of a real-process test module that assert a duration and may run beside
    another real-process test: a test not marked `alone` (on itself or through the module), or
    a helper that such a test calls."""
    tree = ast.parse(source)
    if marks_the_module(tree, "alone"):
        return []
    functions = [
        node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    beside_others = [
        node
        for node in functions
        if node.name.startswith("test_")
        and not any("mark.alone" in ast.unparse(d) for d in node.decorator_list)
    ]
    called_beside_others = {
        call.func.id
        for node in beside_others
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    }
    return [
        node.name
        for node in functions
        if (node in beside_others or node.name in called_beside_others)
        and timed_assertions(ast.unparse(node))
    ]


def test_every_test_module_in_tests_process_is_marked_processes() -> None:
    unmarked = [
        path.name
        for path in sorted(SERIAL.glob("test_*.py"))
        if not marks_the_module_processes(ast.parse(path.read_text()))
    ]
    assert unmarked == []


def test_no_test_outside_tests_process_is_marked_processes() -> None:
    marked = [
        str(path.relative_to(TESTS))
        for path in parallel_lane_files()
        if path != Path(__file__) and "mark.processes" in path.read_text()
    ]
    assert marked == []


def test_every_real_process_test_that_asserts_a_duration_runs_alone() -> None:
    unmarked = {
        path.name: names
        for path in sorted(SERIAL.glob("test_*.py"))
        if (names := timed_but_not_alone(path.read_text()))
    }
    assert unmarked == {}


def test_no_test_outside_tests_process_is_marked_alone() -> None:
    marked = [
        str(path.relative_to(TESTS))
        for path in parallel_lane_files()
        if path != Path(__file__) and "mark.alone" in path.read_text()
    ]
    assert marked == []


PLANTED_REAL_PROCESS = """
import time
import pytest

pytestmark = pytest.mark.processes

@pytest.mark.alone
def test_timed_and_alone():
    began = time.monotonic()
    assert time.monotonic() - began < 5

def test_timed_beside_others():
    began = time.monotonic()
    assert time.monotonic() - began < 5

def test_untimed():
    assert True

def test_untimed_calling_a_timed_helper():
    helper_that_times()

def helper_that_times():
    began = time.monotonic()
    assert time.monotonic() - began < 5

@pytest.mark.alone
def test_alone_calling_a_timed_helper():
    helper_only_alone_tests_call()

def helper_only_alone_tests_call():
    began = time.monotonic()
    assert time.monotonic() - began < 5
"""


def test_the_alone_rule_names_timed_tests_and_helpers_without_the_mark() -> None:
    assert timed_but_not_alone(PLANTED_REAL_PROCESS) == [
        "test_timed_beside_others",
        "helper_that_times",
    ]
    whole_module = PLANTED_REAL_PROCESS.replace(
        "pytestmark = pytest.mark.processes",
        "pytestmark = [pytest.mark.processes, pytest.mark.alone]",
    )
    assert timed_but_not_alone(whole_module) == []


def test_no_test_in_the_parallel_lane_asserts_how_long_something_took() -> None:
    timed = {
        str(path.relative_to(TESTS)): lines
        for path in parallel_lane_files()
        if path != Path(__file__) and (lines := timed_assertions(path.read_text()))
    }
    assert timed == {}


PLANTED = """
import time
from time import perf_counter

def inline():
    began = time.monotonic()
    assert time.monotonic() - began < 0.1

def kept():
    began = perf_counter()
    work()
    elapsed = perf_counter() - began
    assert 0.25 <= elapsed < 2.0

def two_readings():
    start = time.monotonic()
    end = time.monotonic()
    took = end - start
    assert took < 1, f"took {took}"

def hang_guard():
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "never done"
"""


def test_the_scan_finds_each_shape_of_a_timed_assertion_and_not_a_hang_guard() -> None:
    lines = PLANTED.splitlines()
    found = [lines[number - 1].strip() for number in timed_assertions(PLANTED)]
    assert found == [
        "assert time.monotonic() - began < 0.1",
        "assert 0.25 <= elapsed < 2.0",
        'assert took < 1, f"took {took}"',
    ]
