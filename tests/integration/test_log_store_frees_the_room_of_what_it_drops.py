"""The log stores' store-wide bound (`total_bytes`) counts exactly the lines they still hold:
every line an attempt's own caps drop, and every line of a deleted job, frees its room, and
each dropped line is counted on its attempt with its bytes (docs/protocol.md, "Log bounds")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine, LogStore

TS = "2026-11-30T00:00:00.000Z"
LINE = 100 + 4
"""What a 4-byte line costs in the store-wide bound: its text and its record."""

MakeStore = Callable[..., LogStore]


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def seen(store: LogStore, job_id: str, attempt: int = 1) -> tuple[list[str], int, int]:
    page = store.read(job_id, attempt, -1)
    return [ln.text for ln in page.lines], page.dropped_lines, page.dropped_bytes


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    if request.param == "memory":
        return MemoryLogStore
    return lambda **limits: FileLogStore(tmp_path / "logs", **limits)


def test_every_line_an_attempt_drops_is_counted_with_its_bytes(make_store: MakeStore) -> None:
    store = make_store(attempt_lines=1)
    store.append("job", 1, 1, lines(1, "a", "bb", "ccc", "dddd"))
    assert seen(store, "job") == (["dddd"], 3, 1 + 2 + 3)


def test_lines_an_attempts_own_cap_dropped_no_longer_count_store_wide(
    make_store: MakeStore,
) -> None:
    """Room for three lines in all: an attempt capped at two holds two after a batch of
    three, so another attempt's two lines make four, and one line (the least recently written
    attempt's oldest) goes, not more and not fewer."""
    store = make_store(attempt_lines=2, total_bytes=3 * LINE)
    store.append("old", 1, 1, lines(1, "a1..", "a2..", "a3.."))
    store.append("new", 1, 1, lines(1, "b1..", "b2.."))
    assert [seen(store, "old"), seen(store, "new")] == [
        (["a3.."], 2, 8),
        (["b1..", "b2.."], 0, 0),
    ]


def test_a_deleted_jobs_lines_are_gone_and_free_their_room(make_store: MakeStore) -> None:
    """Room for four lines: once a job of two is deleted (an attempt it never had is skipped),
    another attempt holds four of its five lines: the deleted lines count for nothing."""
    store = make_store(total_bytes=4 * LINE)
    store.append("gone", 1, 1, lines(1, "g1.."))
    store.append("gone", 2, 1, lines(1, "g2.."))
    store.append("kept", 1, 1, lines(1, "k1..", "k2.."))

    store.delete_job("gone", 3)
    store.append("kept", 1, 2, lines(2, "k3..", "k4..", "k5.."))

    assert (store.attempts("gone"), seen(store, "gone", 1), seen(store, "gone", 2)) == (
        [],
        ([], 0, 0),
        ([], 0, 0),
    )
    assert seen(store, "kept") == (["k2..", "k3..", "k4..", "k5.."], 1, 4)


def test_a_deleted_job_stays_deleted_when_the_file_store_is_opened_again(
    tmp_path: Path,
) -> None:
    store = FileLogStore(tmp_path)
    store.append("gone", 1, 1, lines(1, "g1.."))
    store.append("gone", 2, 1, lines(1, "g2.."))
    store.append("kept", 1, 1, lines(1, "k1.."))
    store.delete_job("gone", 2)
    again = FileLogStore(tmp_path)
    assert (again.attempts("gone"), seen(again, "gone", 2), seen(again, "kept")) == (
        [],
        ([], 0, 0),
        (["k1.."], 0, 0),
    )
    assert not (tmp_path / "gone").exists()


def test_a_job_whose_logs_cannot_be_deleted_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory the platform may not remove is a 503 naming the log directory, not a bug."""
    store = FileLogStore(tmp_path)
    store.append("job", 1, 1, lines(1, "x"))

    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(log_files.shutil, "rmtree", refuse)
    with pytest.raises(StoreUnavailable) as refused:
        store.delete_job("job", 1)
    assert str(refused.value) == f"cannot delete log lines under {tmp_path}: Permission denied"


def test_an_attempt_forgotten_past_max_attempts_frees_its_room(make_store: MakeStore) -> None:
    """Two attempts remembered, room for three lines: the third attempt's batch of two makes
    the first forgotten, and of the four lines left only the second attempt's oldest goes."""
    store = make_store(max_attempts=2, total_bytes=3 * LINE)
    store.append("a", 1, 1, lines(1, "a1..", "a2.."))
    store.append("b", 1, 1, lines(1, "b1..", "b2.."))  # drops a1..
    store.append("c", 1, 1, lines(1, "c1..", "c2.."))  # forgets a, drops b1..
    assert [seen(store, "a"), seen(store, "b"), seen(store, "c")] == [
        ([], 0, 0),
        (["b2.."], 1, 4),
        (["c1..", "c2.."], 0, 0),
    ]


def test_an_attempt_keeps_lines_up_to_attempt_bytes_exactly(make_store: MakeStore) -> None:
    store = make_store(attempt_bytes=8)
    store.append("job", 1, 1, lines(1, "aaaa", "bbbb"))
    assert seen(store, "job") == (["aaaa", "bbbb"], 0, 0)
