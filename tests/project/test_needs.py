"""A test that needs what the machine lacks skips on a developer machine and fails in CI."""

from __future__ import annotations

import pytest

from tests.support import needs


def test_a_missing_need_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no chromium"):
        needs.missing("no chromium")


def test_a_missing_need_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        needs.missing("no chromium")


def test_a_test_that_needs_root_fails_under_ci_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match="needs root: --run-as"):
        needs.root("--run-as another user")


def test_a_test_that_needs_root_carries_on_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    needs.root("--run-as another user")
