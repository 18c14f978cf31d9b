"""A log batch the FileLogStore accepted is on disk when `append` returns (before its 202):
the attempt's file is fsync'd, and for the file's first record its directory too, so that
the file's name survives a crash as its bytes do (docs/operations.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def test_a_batch_is_fsynced_with_its_new_files_directory_before_append_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    fsync = os.fsync

    def spy(descriptor: int) -> None:
        synced.append(os.fstat(descriptor).st_ino)
        fsync(descriptor)

    store = FileLogStore(tmp_path)
    store.read("job", 1, -1)
    monkeypatch.setattr(os, "fsync", spy)
    store.append("job", 1, 1, [LogLine(1, TS, "stdout", "first")])
    first = list(synced)
    synced.clear()
    store.append("job", 1, 2, [LogLine(2, TS, "stdout", "second")])

    file, directory = (tmp_path / "job" / "1.jsonl").stat(), (tmp_path / "job").stat()
    assert {file.st_ino, directory.st_ino} <= set(first)
    assert file.st_ino in synced
