"""The MySQL wake-ups' poller (`store/mysql_wakeups.py`), one poll at a time on a manual clock:
it hands on the others' rows and skips its own, reads a row that commits after a higher one,
and keeps `job_wakeups` about a minute long, pruning a bounded batch at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from moonrun.store import mysql_wakeups
from moonrun.store.mysql import MySQLStore
from moonrun.store.mysql_wakeups import HOLE_WAIT_S, KEEP_S, SEND, MySQLWakeups

Heard = list[tuple[str, str | None]]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(mysql_url: str) -> Iterator[MySQLStore]:
    store = MySQLStore(mysql_url)
    store._read(lambda cursor: cursor.execute("DELETE FROM job_wakeups"))
    yield store
    store.close()


def poller(store: MySQLStore, heard: Heard, clock: Clock, fail: bool = False) -> MySQLWakeups:
    def hear(job_id: str, endpoint_id: str | None) -> None:
        heard.append((job_id, endpoint_id))
        if fail:
            raise RuntimeError("event loop is closed")

    wakeups = MySQLWakeups(
        lambda: store._open(autocommit=True), store._announce, hear, lambda: None, clock=clock
    )
    wakeups.open()
    return wakeups


def rows(store: MySQLStore) -> int:
    def count(cursor: Any) -> int:
        cursor.execute("SELECT COUNT(*) FROM job_wakeups")
        return int(cursor.fetchone()[0])

    return store._read(count)


def send(store: MySQLStore, origin: str, *jobs: str, endpoint: str | None = None) -> None:
    store._announce(SEND, [(origin, job, endpoint) for job in jobs])


def test_a_poll_hands_on_the_other_processes_rows_and_skips_its_own(store: MySQLStore) -> None:
    heard: Heard = []
    wakeups = poller(store, heard, Clock())
    send(store, "0badc0de", "job-1", endpoint="ep-1")
    send(store, wakeups.origin, "job-2", endpoint="ep-1")
    send(store, "0badc0de", "job-3")
    wakeups.poll()
    assert heard == [("job-1", "ep-1"), ("job-3", None)]
    wakeups.poll()
    assert len(heard) == 2  # each row once
    assert wakeups.polls == 2


def test_rows_written_before_the_poller_connected_are_not_handed_on(store: MySQLStore) -> None:
    send(store, "0badc0de", "job-old")
    heard: Heard = []
    wakeups = poller(store, heard, Clock())
    wakeups.poll()
    assert heard == []


def test_a_failing_waker_does_not_stop_the_polling(
    store: MySQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    heard: Heard = []
    wakeups = poller(store, heard, Clock(), fail=True)
    send(store, "0badc0de", "job-1", "job-2")
    wakeups.poll()
    assert [job for job, _ in heard] == ["job-1", "job-2"]
    assert "waking waiters" in caplog.text


def test_a_row_that_commits_after_a_higher_one_is_still_handed_on(store: MySQLStore) -> None:
    """Ids are given at insert, not at commit: the poller looks for the hole it saw."""
    send(store, "0badc0de", "job-before")  # not an empty table: its holes are real
    heard: Heard = []
    clock = Clock()
    wakeups = poller(store, heard, clock)
    late = store._open(autocommit=False)
    try:
        with late.cursor() as cursor:
            cursor.execute(SEND, ("0badc0de", "job-late", None))  # takes an id, not committed
        send(store, "0badc0de", "job-early")
        wakeups.poll()
        assert heard == [("job-early", None)]
        late.commit()
        clock.now += HOLE_WAIT_S / 2
        wakeups.poll()
        assert heard == [("job-early", None), ("job-late", None)]
    finally:
        late.close()


def test_a_hole_never_filled_is_forgotten(store: MySQLStore) -> None:
    send(store, "0badc0de", "job-before")
    heard: Heard = []
    clock = Clock()
    wakeups = poller(store, heard, clock)
    late = store._open(autocommit=False)
    try:
        with late.cursor() as cursor:
            cursor.execute(SEND, ("0badc0de", "job-rolled-back", None))
        send(store, "0badc0de", "job-1")
        wakeups.poll()
        assert len(wakeups._holes) == 1
        late.rollback()
        clock.now += HOLE_WAIT_S + 0.1
        wakeups.poll()
        assert wakeups._holes == {}
        assert heard == [("job-1", None)]
    finally:
        late.close()


def test_rows_older_than_a_minute_are_pruned_so_the_table_stays_bounded(
    store: MySQLStore,
) -> None:
    heard: Heard = []
    clock = Clock()
    wakeups = poller(store, heard, clock)
    send(store, "0badc0de", *(f"job-a{n}" for n in range(300)))
    wakeups.poll()
    clock.now += KEEP_S / 2
    send(store, "0badc0de", *(f"job-b{n}" for n in range(200)))
    wakeups.poll()
    assert rows(store) == 500
    clock.now += KEEP_S / 2
    wakeups.poll()  # the first rows are a minute old now
    assert rows(store) == 200
    clock.now += KEEP_S / 2
    wakeups.poll()
    assert rows(store) == 0
    assert len(heard) == 500


def test_a_prune_deletes_a_bounded_batch_and_goes_on_at_the_next_poll(
    store: MySQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mysql_wakeups, "PRUNE_BATCH", 100)
    clock = Clock()
    wakeups = poller(store, [], clock)
    send(store, "0badc0de", *(f"job-{n}" for n in range(250)))
    wakeups.poll()
    clock.now += KEEP_S
    assert wakeups.poll() is True  # more to prune: poll again at once
    assert rows(store) == 150
    assert wakeups.poll() is True
    assert rows(store) == 50
    assert wakeups.poll() is False
    assert rows(store) == 0
    assert wakeups.poll() is False  # nothing newer is old enough: no DELETE at all
