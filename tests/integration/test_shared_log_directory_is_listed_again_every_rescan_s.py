"""A FileLogStore sharing its directory with other platform processes lists it again every
`rescan_s` (on a manual clock here), not sooner: only then does its store-wide bound count the
attempts another process made (and drop their oldest lines for every reader) and no longer
count those another process deleted."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"
LINE = 100 + 4


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def test_another_processs_attempt_counts_from_the_listing_rescan_s_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(log_files, "time", SimpleNamespace(monotonic=lambda: now[0]))
    other = FileLogStore(tmp_path, shared=True)
    tight = FileLogStore(tmp_path, shared=True, total_bytes=3 * LINE, rescan_s=10)
    tight.read("new", 1, -1)  # listed at 1000
    other.append("old", 1, 1, lines(1, "o1..", "o2.."))

    def old() -> tuple[list[str], int]:
        page = other.read("old", 1, -1)
        return [ln.text for ln in page.lines], page.dropped_lines

    now[0] = 1009.5
    tight.append("new", 1, 1, lines(1, "n1..", "n2.."))  # not listed again: "old" unknown
    before = old()
    now[0] = 1010.0
    tight.append("new", 1, 2, lines(2, "n3.."))  # listed again: four lines, room for three
    after = old()
    now[0] = 1015.0
    tight.append("new", 1, 3, lines(3, "n4.."))  # not listed again yet

    assert (before, after) == ((["o1..", "o2.."], 0), (["o2.."], 1))


def test_a_job_another_process_deleted_leaves_the_bound_at_the_next_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for three lines: listed again, the directory has no "gone" (two lines) but a new
    "other" (one line), so the first attempt keeps its line beside its next one."""
    now = [1000.0]
    monkeypatch.setattr(log_files, "time", SimpleNamespace(monotonic=lambda: now[0]))
    other = FileLogStore(tmp_path, shared=True)
    tight = FileLogStore(tmp_path, shared=True, total_bytes=3 * LINE, rescan_s=10)
    tight.append("kept", 1, 1, lines(1, "k1.."))
    tight.append("gone", 1, 1, lines(1, "g1..", "g2.."))
    other.delete_job("gone", 1)
    other.append("other", 1, 1, lines(1, "o1.."))

    now[0] = 1010.0
    tight.append("kept", 1, 2, lines(2, "k2.."))

    page = tight.read("kept", 1, -1)
    assert ([ln.text for ln in page.lines], page.dropped_lines) == (["k1..", "k2.."], 0)
