"""A deleted job's data beside the job store goes with it: both log stores forget every line of
its attempts (in memory, on disk, and after a restart) and give their bytes back to the
store-wide bound; the artifact store deletes its files. Other jobs keep theirs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moonrun.artifacts.file import FileArtifactStore
from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import LINE_RECORD_BYTES, MemoryLogStore
from moonrun.logs.protocol import LogLine, LogStore

TS = "2026-11-30T00:00:00.000Z"
MakeStore = Callable[..., LogStore]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    if request.param == "memory":
        return MemoryLogStore
    return lambda **limits: FileLogStore(tmp_path / "logs", **limits)


def write(store: LogStore, job_id: str, attempt: int, text: str) -> None:
    store.append(job_id, attempt, 0, [LogLine(0, TS, "stdout", text)])


def test_deleting_a_job_forgets_every_attempts_lines_and_frees_their_room(
    make_store: MakeStore,
) -> None:
    room = 2 * (10 + LINE_RECORD_BYTES)  # two lines of ten bytes
    store = make_store(total_bytes=room)
    write(store, "job-gone", 1, "a" * 10)
    write(store, "job-gone", 2, "b" * 10)

    store.delete_job("job-gone", 2)
    write(store, "job-kept", 1, "c" * 10)
    write(store, "job-kept", 2, "d" * 10)

    assert store.attempts("job-gone") == []
    assert store.read("job-gone", 1, -1).lines == []
    # Both new lines fit: the deleted job's bytes no longer count against the store's bound.
    assert [store.read("job-kept", n, -1).kept_lines for n in (1, 2)] == [1, 1]


def test_a_deleted_jobs_log_files_are_gone_and_stay_gone_after_a_restart(
    tmp_path: Path,
) -> None:
    store = FileLogStore(tmp_path / "logs")
    write(store, "job-gone", 1, "gone")
    write(store, "job-kept", 1, "kept")

    store.delete_job("job-gone", 1)
    again = FileLogStore(tmp_path / "logs")

    assert not (tmp_path / "logs" / "job-gone").exists()
    assert (again.attempts("job-gone"), again.attempts("job-kept")) == ([], [1])


def test_deleting_a_job_deletes_its_artifacts_and_only_its_own(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path / "artifacts", attempt_bytes=8)
    store.put_chunk("job-gone", 1, "out.txt", 0, b"12345678", True)
    store.put_chunk("job-kept", 1, "out.txt", 0, b"kept", True)

    store.delete_job("job-gone", 1)
    store.delete_job("job-never", 3)  # nothing stored: nothing to do
    store.put_chunk("job-gone", 1, "out.txt", 0, b"87654321", True)  # its count restarts

    assert not (tmp_path / "artifacts" / "job-never").exists()
    assert [a.name for a in store.artifacts("job-kept")] == ["out.txt"]
    assert store.read_chunk("job-gone", 1, "out.txt", 0) == b"87654321"
