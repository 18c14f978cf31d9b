"""A batch Run sends again (its 202 was lost) is answered from what the FileLogStore holds and
writes nothing: neither a batch it stores nor one whose lines a cap dropped, at or below the
attempt's floor, grows the attempt's file; only a final batch sent again after its seq was
stored without saying so is noted, once."""

from __future__ import annotations

from pathlib import Path

from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def test_batches_sent_again_stored_or_dropped_leave_the_file_as_it_was(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path, attempt_lines=2)
    store.append("job", 1, 1, lines(1, "a"))
    store.append("job", 1, 2, lines(2, "b", "c"))  # drops batch 1: the floor is 1
    store.append("job", 1, 4, lines(4, "d"))
    path = tmp_path / "job" / "1.jsonl"
    before = path.read_bytes()

    answers = [store.append("job", 1, seq, lines(seq, "again")) for seq in (4, 2, 1, 0)]

    assert (answers, path.read_bytes()) == ([4, 4, 4, 4], before)


def test_a_final_batch_sent_again_is_noted_once(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("job", 1, 1, lines(1, "a"))
    path = tmp_path / "job" / "1.jsonl"
    size = path.stat().st_size
    store.append("job", 1, 1, lines(1, "a"), final=True)
    noted = path.stat().st_size
    store.append("job", 1, 1, lines(1, "a"), final=True)
    assert (noted - size, path.stat().st_size, store.complete("job", 1)) == (
        len(b'{"final":true}\n'),
        noted,
        True,
    )
