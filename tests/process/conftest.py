"""What every real-process test shares: sockets its own HTTP clients leaked are collected at
its end, not in whichever test the garbage collector happens to run next; and each test's
report of its body (`tests/support/reports.py`), so that a fixture can show its processes'
logs when the test failed."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

from tests.support.reports import CALL_REPORT


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Keeps each test's report of its body on its item (`reports.failed`)."""
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[CALL_REPORT] = report
    return report


@pytest.fixture(autouse=True)
def collect_leaked_sockets() -> Iterator[None]:
    """A socket of a test's HTTP client pool that the platform closed while it sat idle is
    collected unclosed by httpcore; collected later, during another test, `filterwarnings =
    error` turned it into that test's failure (test_wait_for_logs_e2e.py in CI). Collected
    here, at the end of the test that made it, with its ResourceWarning ignored: a leak of the
    test's tools, not of the platform or Run under test (their own sockets live in other
    processes)."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
