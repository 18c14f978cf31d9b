"""A batch's record reaches its file whole, however few bytes each write takes; a write that
fails halfway (a full disk) is taken back, answered 503 (`StoreUnavailable`), and the batch
sent again lands once on a file of whole records."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def batch(seq: int, text: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text)]


def test_a_record_written_a_few_bytes_at_a_time_reads_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pwrite = os.pwrite

    def three_bytes(descriptor: int, data: bytes | memoryview, offset: int) -> int:
        return pwrite(descriptor, bytes(data[:3]), offset)

    monkeypatch.setattr(os, "pwrite", three_bytes)
    FileLogStore(tmp_path).append("job", 1, 1, batch(1, "one"))
    FileLogStore(tmp_path).append("job", 1, 2, batch(2, "two"))
    monkeypatch.undo()
    assert [ln.text for ln in FileLogStore(tmp_path).read("job", 1, -1).lines] == ["one", "two"]


def test_a_write_that_fails_halfway_is_taken_back_and_the_batch_lands_when_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileLogStore(tmp_path)
    store.append("job", 1, 1, batch(1, "one"))
    pwrite = os.pwrite

    def full_disk(descriptor: int, data: bytes | memoryview, offset: int) -> int:
        if len(data) > 10:
            return pwrite(descriptor, bytes(data[:10]), offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(StoreUnavailable):
        store.append("job", 1, 2, batch(2, "two"))
    monkeypatch.undo()
    store.append("job", 1, 2, batch(2, "two"))

    assert [ln.text for ln in FileLogStore(tmp_path).read("job", 1, -1).lines] == ["one", "two"]
    assert all(
        line.startswith(b"{") for line in (tmp_path / "job" / "1.jsonl").read_bytes().splitlines()
    )
