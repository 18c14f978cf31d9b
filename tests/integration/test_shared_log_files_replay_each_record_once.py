"""A platform process reading an attempt's file that another process keeps writing replays
each record once, from where it stopped: a store-wide drop another process noted takes the
lines it names, and no more, however many times the reader comes back; a job another process
deleted no longer counts in this one's store-wide bound, nor lists attempts, also when both
delete it; a line an operator mangled is passed over."""

from __future__ import annotations

from pathlib import Path

from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"
LINE = 100 + 4


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def seen(store: FileLogStore) -> tuple[list[str], int]:
    page = store.read("x", 1, -1)
    return [ln.text for ln in page.lines], page.dropped_lines


def test_a_drop_another_process_noted_is_replayed_once(tmp_path: Path) -> None:
    writer = FileLogStore(tmp_path, shared=True, total_bytes=3 * LINE)
    reader = FileLogStore(tmp_path, shared=True)
    writer.append("x", 1, 1, lines(1, "x1..", "x2.."))
    assert seen(reader) == (["x1..", "x2.."], 0)
    writer.append("y", 1, 1, lines(1, "y1..", "y2.."))  # drops x1.., noted in x's file
    assert seen(reader) == (["x2.."], 1)
    writer.append("x", 1, 2, lines(2, "x3.."))  # drops y1..: x's file only grows
    assert seen(reader) == seen(writer) == (["x2..", "x3.."], 1)


def test_a_job_another_process_deleted_frees_its_room_here(tmp_path: Path) -> None:
    """Room for three lines: once this process sees that another deleted a job of two lines,
    three lines of another attempt all fit."""
    here = FileLogStore(tmp_path, shared=True, total_bytes=3 * LINE)
    there = FileLogStore(tmp_path, shared=True)
    here.append("gone", 1, 1, lines(1, "g1..", "g2.."))
    there.delete_job("gone", 1)
    assert here.read("gone", 1, -1).lines == []

    here.append("kept", 1, 1, lines(1, "k1..", "k2..", "k3.."))

    page = here.read("kept", 1, -1)
    assert ([ln.text for ln in page.lines], page.dropped_lines) == (["k1..", "k2..", "k3.."], 0)


def test_a_job_deleted_by_two_processes_is_gone_from_both(tmp_path: Path) -> None:
    """Each platform's retention may delete the same job: the second finds its files gone and
    still forgets it; a process that did not delete it lists no attempt of it."""
    here, there, third = (FileLogStore(tmp_path, shared=True) for _ in range(3))
    here.append("job", 1, 1, lines(1, "j1.."))
    assert [store.attempts("job") for store in (there, third)] == [[1], [1]]
    here.delete_job("job", 1)
    there.delete_job("job", 1)
    assert [store.attempts("job") for store in (here, there, third)] == [[], [], []]


def test_a_line_mangled_in_a_file_loses_only_its_own_lines(tmp_path: Path) -> None:
    FileLogStore(tmp_path).append("x", 1, 1, lines(1, "one"))
    with open(tmp_path / "x" / "1.jsonl", "ab") as handle:
        handle.write(b"not json\n")
    FileLogStore(tmp_path).append("x", 1, 2, lines(2, "two"))
    assert seen(FileLogStore(tmp_path)) == (["one", "two"], 0)
