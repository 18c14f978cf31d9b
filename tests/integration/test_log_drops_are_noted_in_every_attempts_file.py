"""What the store-wide bound drops is noted in each attempt's file (docs/protocol.md, "Log
bounds"), also the attempt whose batch made the store go past it, and every other attempt's
when one of them cannot be noted (its file gone, or locked by another writer): opened again
under a larger cap, the FileLogStore still has those lines dropped."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"
LINE = 100 + 4
"""What a 4-byte line costs in the store-wide bound: its text and its record."""


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def seen(store: FileLogStore, job_id: str) -> tuple[list[str], int]:
    page = store.read(job_id, 1, -1)
    return [ln.text for ln in page.lines], page.dropped_lines


def test_a_drop_from_the_attempt_being_appended_to_is_noted(tmp_path: Path) -> None:
    """The only attempt goes past the bound with its second batch: its own oldest line goes,
    and stays gone under the default cap."""
    store = FileLogStore(tmp_path, total_bytes=3 * LINE)
    store.append("job", 1, 1, lines(1, "a1..", "a2.."))
    store.append("job", 1, 2, lines(2, "a3..", "a4.."))
    assert (
        seen(store, "job")
        == seen(FileLogStore(tmp_path), "job")
        == (
            ["a2..", "a3..", "a4.."],
            1,
        )
    )


@pytest.mark.parametrize("first", ["gone", "locked"])
def test_an_attempt_that_cannot_be_noted_leaves_the_next_ones_noted(
    tmp_path: Path, first: str
) -> None:
    store = FileLogStore(tmp_path, total_bytes=2 * LINE)
    store.append("a", 1, 1, lines(1, "a1.."))
    store.append("b", 1, 1, lines(1, "b1.."))
    path = tmp_path / "a" / "1.jsonl"
    holder = os.open(path, os.O_RDWR)
    try:
        if first == "gone":
            path.unlink()
        else:
            fcntl.flock(holder, fcntl.LOCK_EX)  # another writer
        store.append("c", 1, 1, lines(1, "c1..", "c2.."))  # drops a1.. and b1..
    finally:
        os.close(holder)

    assert seen(store, "b") == seen(FileLogStore(tmp_path), "b") == ([], 1)


def test_drops_found_at_open_and_after_the_batch_are_all_noted(tmp_path: Path) -> None:
    """Opened under a lower cap, the store's first call is a batch of the attempt written
    longest ago: opening drops that attempt's oldest line, the batch then another attempt's,
    and both drops are noted."""
    roomy = FileLogStore(tmp_path)
    roomy.append("a", 1, 1, lines(1, "a1..", "a2.."))
    roomy.append("b", 1, 1, lines(1, "b1..", "b2.."))

    FileLogStore(tmp_path, total_bytes=3 * LINE).append("a", 1, 2, lines(2, "a3.."))

    again = FileLogStore(tmp_path)
    assert [seen(again, "a"), seen(again, "b")] == [(["a2..", "a3.."], 1), (["b2.."], 1)]


def test_an_attempt_cut_by_two_later_batches_of_others_notes_both_drops(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path, total_bytes=3 * LINE)
    store.append("a", 1, 1, lines(1, "a1..", "a2..", "a3.."))
    store.append("b", 1, 1, lines(1, "b1.."))
    store.append("b", 1, 2, lines(2, "b2.."))
    assert seen(store, "a") == seen(FileLogStore(tmp_path), "a") == (["a3.."], 2)


def test_a_drop_note_that_cannot_be_written_fails_no_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note is left out (the cap drops those lines again after a restart); the batch that
    made the drop is stored and acknowledged."""
    write_all = log_files._write_all

    def full_disk(descriptor: int, data: bytes, offset: int = 0) -> None:
        if data.startswith(b'{"drop"'):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_all(descriptor, data, offset)

    monkeypatch.setattr(log_files, "_write_all", full_disk)
    store = FileLogStore(tmp_path, total_bytes=2 * LINE)
    store.append("a", 1, 1, lines(1, "a1.."))
    assert store.append("b", 1, 1, lines(1, "b1..", "b2..")) == 1
    assert [seen(store, "a"), seen(store, "b")] == [([], 1), (["b1..", "b2.."], 0)]


def test_a_drop_of_several_lines_is_noted_with_its_count(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path, total_bytes=3 * LINE)
    store.append("a", 1, 1, lines(1, "a1..", "a2..", "a3.."))
    store.append("b", 1, 1, lines(1, "b1..", "b2.."))  # drops a1.. and a2..
    assert seen(FileLogStore(tmp_path), "a") == (["a3.."], 2)
