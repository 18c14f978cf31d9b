"""Announcements to the other platform processes (`store/announcements.py`, shared by the
PostgreSQL and MySQL wake-ups): sent in order without repeats, at most a batch at a time,
never blocking the caller, and counted when they cannot be sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from moonrun.store import announcements
from moonrun.store.announcements import Announcements

STOP = ""


def until(condition: Callable[[], bool]) -> None:
    """Wait for the sending thread to get somewhere (a hang guard, not a bound)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the sending thread never got there"
        time.sleep(0.005)


def test_what_waits_is_sent_in_order_without_repeats_and_at_most_a_batch_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(announcements, "BATCH", 3)
    sent: list[list[str]] = []
    hold = threading.Event()

    def send(batch: list[str]) -> None:
        hold.wait(10)  # the first batch waits, so that the rest queue up behind it
        sent.append(batch)

    told = Announcements(send, STOP)
    told.start()
    for name in ["a", "b", "b", "c", "a", "d", "e"]:
        told.put(name)
    hold.set()
    told.stop()
    flat = [name for batch in sent for name in batch]
    assert all(len(batch) <= 3 for batch in sent)
    assert all(len(batch) == len(set(batch)) for batch in sent)
    assert (flat[0], set(flat)) == ("a", {"a", "b", "c", "d", "e"})
    assert told.dropped == 0


def test_nothing_is_queued_before_start_or_after_stop() -> None:
    sent: list[list[str]] = []
    told = Announcements(sent.append, STOP)
    told.put("early")
    assert told.waiting == 0
    told.start()
    told.stop()
    told.put("late")
    assert (told.waiting, sent) == (0, [])


def test_a_full_queue_drops_and_counts_instead_of_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(announcements, "QUEUE_BOUND", 2)
    hold = threading.Event()
    told = Announcements(lambda batch: hold.wait(10), STOP)
    told.start()
    told.put("taken")
    until(lambda: told.waiting == 0)  # the sender took it, and waits in `send`
    for name in ["1", "2", "3", "4"]:
        told.put(name)
    assert told.dropped == 2
    hold.set()
    told.stop()


def test_a_batch_the_database_refuses_is_counted_dropped_and_the_sender_goes_on() -> None:
    sent: list[list[str]] = []

    def send(batch: list[str]) -> None:
        if "bad" in batch:
            raise OSError("the database went away")
        sent.append(batch)

    told = Announcements(send, STOP)
    told.start()
    told.put("bad")
    until(lambda: told.dropped == 1)
    told.put("good")
    told.stop()
    assert (sent, told.dropped) == ([["good"]], 1)
