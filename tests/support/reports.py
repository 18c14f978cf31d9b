"""Whether a test's body failed, for a fixture's teardown (tests/process/conftest.py records
each real-process test's report)."""

from __future__ import annotations

import pytest

CALL_REPORT = pytest.StashKey[pytest.TestReport]()
"""A test's report of its body."""


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the body of the test `request` serves failed: a fixture's teardown then shows
    its processes' logs (a failure in the body never reaches the fixture's own `except`)."""
    report = request.node.stash.get(CALL_REPORT, None)
    return report is not None and report.failed
