"""Lines the store-wide cap dropped stay dropped, and counted, when the FileLogStore is opened
again, even with a cap that would keep them: the drop is recorded in the attempt's file.
Opened again under the same cap, replaying the file drops them anew, which hides a drop that
was never recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"
TIGHT = 3 * (100 + 4)
"""Room for three 4-byte lines and their records, store-wide."""


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def seen(store: FileLogStore, job_id: str) -> tuple[list[str], int, int]:
    page = store.read(job_id, 1, -1)
    return [ln.text for ln in page.lines], page.dropped_lines, page.dropped_bytes


def test_a_store_wide_drop_is_recorded_and_stays_dropped_under_a_larger_cap(
    tmp_path: Path,
) -> None:
    first = FileLogStore(tmp_path, total_bytes=TIGHT)
    first.append("old", 1, 1, lines(1, "o1..", "o2.."))
    first.append("new", 1, 1, lines(1, "n1..", "n2.."))

    again = FileLogStore(tmp_path)  # the default cap: room for everything

    assert seen(first, "old") == (["o2.."], 1, 4)
    assert [seen(again, "old"), seen(again, "new")] == [(["o2.."], 1, 4), (["n1..", "n2.."], 0, 0)]


def test_a_store_wide_drop_found_when_the_store_is_opened_is_recorded_too(
    tmp_path: Path,
) -> None:
    """A cap lowered between two runs drops at the first open; a later open with the old cap
    still sees those lines dropped."""
    roomy = FileLogStore(tmp_path)
    roomy.append("old", 1, 1, lines(1, "o1..", "o2.."))
    roomy.append("new", 1, 1, lines(1, "n1..", "n2.."))
    tight = FileLogStore(tmp_path, total_bytes=TIGHT)
    assert seen(tight, "old") == (["o2.."], 1, 4)

    again = FileLogStore(tmp_path)

    assert seen(again, "old") == seen(tight, "old")


def test_an_attempt_that_lost_lines_to_the_store_wide_cap_takes_more(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path, total_bytes=TIGHT)
    store.append("old", 1, 1, lines(1, "o1..", "o2.."))
    store.append("new", 1, 1, lines(1, "n1..", "n2.."))
    store.append("old", 1, 2, lines(2, "o3.."))
    again = FileLogStore(tmp_path, total_bytes=TIGHT)
    assert seen(store, "old") == seen(again, "old")
    assert seen(store, "old")[0][-1] == "o3.."


@pytest.mark.parametrize("store", ["memory", "file"])
def test_a_batch_is_stored_once_and_never_at_or_below_what_was_dropped(
    tmp_path: Path, store: str
) -> None:
    """The same seq again is answered, not stored; a seq whose lines were all dropped (the
    floor) or an older one is not stored again either."""
    logs = (
        MemoryLogStore(attempt_lines=2)
        if store == "memory"
        else FileLogStore(tmp_path, attempt_lines=2)
    )
    logs.append("job", 1, 1, lines(1, "a1.."))
    logs.append("job", 1, 1, lines(1, "a1.."))
    logs.append("job", 1, 2, lines(2, "b1..", "b2.."))  # drops batch 1: the floor is 1
    again = [logs.append("job", 1, seq, lines(seq, "late")) for seq in (1, 0)]
    page = logs.read("job", 1, -1)
    assert ([ln.text for ln in page.lines], page.dropped_lines, again) == (
        ["b1..", "b2.."],
        1,
        [2, 2],
    )
