"""A full disk under the platform's log and artifact files: typed 503s, never a 500, and
nothing half-stored once space is back (tests/process/test_process_faults.py fills a real process's
disk; here the write itself fails, deterministically, in process)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.artifacts import file as artifact_files
from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory


class Disk:
    """Whether the disk is full: while it is, the stores' file writes fail with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        for module, name in ((log_files, "_write_all"), (artifact_files, "_write")):
            write = getattr(module, name)
            monkeypatch.setattr(module, name, self.failing(write))

    def failing(self, write: Any) -> Any:
        def maybe(*args: Any) -> Any:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(*args)

        return maybe


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path, logs=FileLogStore(tmp_path / "logs")) as cast:
        yield cast


def test_a_log_batch_that_cannot_be_written_is_503_and_lands_once_when_sent_again(
    cast: Cast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk full: the batch is 503 store_unavailable; sent again with space, 202, stored once."""
    disk = Disk(monkeypatch)
    world, run = cast.world, cast.run.start()
    job_id = world.submit(cast.server_id, cast.owner[1])["id"]
    attempt = run.run_to_running(job_id)

    disk.full = True
    refused = run.send_logs(job_id, attempt, 0, "first words")
    disk.full = False
    accepted = run.send_logs(job_id, attempt, 0, "first words")
    reread = FileLogStore(tmp_path / "logs").read(job_id, attempt, -1)

    error = refused.json()["error"]
    assert (refused.status_code, error["code"]) == (503, "store_unavailable")
    assert "No space left on device" in error["message"]
    assert (accepted.status_code, accepted.json()["accepted_through_seq"]) == (202, 0)
    assert [line.text for line in reread.lines] == ["first words"]


def test_an_artifact_chunk_that_cannot_be_written_is_503_and_lands_when_sent_again(
    cast: Cast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk full: the chunk is 503 store_unavailable; sent again with space, 202, complete."""
    disk = Disk(monkeypatch)
    world, run = cast.world, cast.run.start()
    job_id = world.submit(cast.server_id, cast.owner[1])["id"]
    attempt = run.run_to_running(job_id)

    disk.full = True
    refused = run.put_chunk(job_id, attempt, "out.txt", 0, b"bytes", final=True)
    disk.full = False
    accepted = run.put_chunk(job_id, attempt, "out.txt", 0, b"bytes", final=True)
    listed = world.api("GET", f"/api/v1/jobs/{job_id}/artifacts").json()["artifacts"]

    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "store_unavailable")
    assert accepted.status_code == 202
    complete = {"attempt": attempt, "name": "out.txt", "size": 5, "complete": True}
    assert listed == [complete]
