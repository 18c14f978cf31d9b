"""The wake-ups' payloads (`store/pg_wakeups.py`): a process hears the others' changes and
skips its own, and a waker that fails does not stop the listening (no database needed)."""

from __future__ import annotations

import pytest

from moonrun.store import pg_wakeups
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


def test_a_process_that_heard_no_other_listen_announces_nothing() -> None:
    sent: list[object] = []
    alone = PostgresWakeups("", lambda statement, params: sent.append(params), print, print)
    alone.announce("job-1", "ep-1")
    alone.announce("job-2", None)
    assert not alone.others_listen()
    assert alone.unsent == 2
    assert alone._announcements.waiting == 0


def test_another_process_saying_it_listens_is_heard_for_a_while_and_answered() -> None:
    listener = wakeups([])
    listener._hello_due = 123.0  # its next periodic hello
    listener._hear(f"{listener.origin}")  # its own hello
    assert not listener.others_listen()
    listener._hear("0badc0de")
    assert listener.others_listen()
    assert listener._hello_due == 0.0  # a process it had not heard of: answered at once
    listener._hello_due = 123.0
    listener._hear("0badc0de")
    assert listener._hello_due == 123.0  # one it hears already is not answered again
    listener.announce("job-1", "ep-1")
    assert listener.unsent == 0
    assert listener._peer_heard_at is not None
    listener._peer_heard_at -= pg_wakeups.PEER_TTL_S
    assert not listener.others_listen()  # it stopped saying so: gone
