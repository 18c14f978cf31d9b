"""An attempt's log file is rewritten to its kept lines once it grows past twice its size when
last rewritten (plus `COMPACT_SLACK`, 0 here), not at twice exactly and not later; a rewrite
that fails (a full disk) leaves the batch stored and the file as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson
import pytest

from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def batch(seq: int, text: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text)]


def record_size(seq: int, text: str) -> int:
    return len(orjson.dumps({"seq": seq, "lines": [[TS, "stdout", text]]})) + 1


def test_a_file_is_rewritten_once_past_twice_its_rewritten_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_files, "COMPACT_SLACK", 0)
    store = FileLogStore(tmp_path, attempt_lines=1)
    path = tmp_path / "job" / "1.jsonl"
    store.append("job", 1, 1, batch(1, "first"))  # past twice 0: rewritten at once
    rewritten = path.stat()

    # A record that brings the file to twice its rewritten size exactly: not past it.
    store.append("job", 1, 2, batch(2, "x" * (rewritten.st_size - record_size(2, ""))))
    at_twice = path.stat()
    store.append("job", 1, 3, batch(3, "y"))  # one record more: past it
    past = path.stat()

    assert (at_twice.st_ino, at_twice.st_size) == (rewritten.st_ino, 2 * rewritten.st_size)
    assert past.st_ino != rewritten.st_ino
    assert [ln.text for ln in FileLogStore(tmp_path).read("job", 1, -1).lines] == ["y"]


def test_a_rewrite_that_fails_leaves_the_batch_stored_and_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_files, "COMPACT_SLACK", 0)
    open_private = log_files.open_private

    def full_disk(path: Path, flags: int) -> int:
        if path.suffix == ".tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return open_private(path, flags)

    monkeypatch.setattr(log_files, "open_private", full_disk)
    store = FileLogStore(tmp_path, attempt_lines=2)
    answers = [store.append("job", 1, seq, batch(seq, f"line {seq}")) for seq in (1, 2, 3)]

    assert answers == [1, 2, 3]
    page = FileLogStore(tmp_path, attempt_lines=2).read("job", 1, -1)
    assert ([ln.text for ln in page.lines], page.dropped_lines) == (["line 2", "line 3"], 1)
