"""The wake-ups' payloads (`store/pg_wakeups.py`): a process hears the others' changes and
skips its own, and a waker that fails does not stop the listening (no database needed)."""

from __future__ import annotations

import pytest

from moonrun.store.pg_wakeups import PostgresWakeups


def wakeups(heard: list[tuple[str, str | None]], fail: bool = False) -> PostgresWakeups:
    def hear(job_id: str, endpoint_id: str | None) -> None:
        heard.append((job_id, endpoint_id))
        if fail:
            raise RuntimeError("event loop is closed")

    return PostgresWakeups("", lambda statement, params: None, hear, lambda: None)


def test_a_process_hears_the_others_changes_and_skips_its_own() -> None:
    heard: list[tuple[str, str | None]] = []
    listener = wakeups(heard)
    listener._hear("0badc0de job-1 ep-1")
    listener._hear("0badc0de job-2")
    listener._hear(f"{listener.origin} job-3 ep-1")
    listener._hear("not a payload of ours at all")
    assert heard == [("job-1", "ep-1"), ("job-2", None)]


def test_a_failing_waker_does_not_stop_the_listening(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[tuple[str, str | None]] = []
    listener = wakeups(heard, fail=True)
    listener._hear("0badc0de job-1 ep-1")
    listener._hear("0badc0de job-2 ep-1")
    assert [job for job, _ in heard] == ["job-1", "job-2"]
    assert "waking waiters" in caplog.text


def test_nothing_is_queued_for_peers_before_the_wake_ups_start() -> None:
    listener = wakeups([])
    listener.announce("job-1", "ep-1")
    assert listener._announcements.waiting == 0
