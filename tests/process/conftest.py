"""What every real-process test shares: sockets its own HTTP clients leaked are collected at
its end, not in whichever test the garbage collector happens to run next."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest


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
