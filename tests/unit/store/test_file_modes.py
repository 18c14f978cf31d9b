"""What the platform writes to disk is its owner's alone, whatever the umask it starts under."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.artifacts.file import FileArtifactStore
from moonrun.store.file import FileStore


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common umask, under which new files are 0644 and new directories 0755."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes_under(root: Path) -> dict[str, str]:
    """The permission bits of everything under `root`, by relative path."""
    return {
        str(path.relative_to(root)): oct(stat.S_IMODE(path.stat().st_mode))
        for path in sorted(root.rglob("*"))
    }


def test_the_file_store_and_its_wal_files_are_0600_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    """platform.db, -wal and -shm are created 0600 in an existing 0755 directory."""
    directory = tmp_path / "state"
    directory.mkdir(mode=0o755)
    store = FileStore(directory / "platform.db")
    try:
        modes = modes_under(directory)  # while open: closing checkpoints and removes -wal, -shm
    finally:
        store.close()
    assert modes == {"platform.db": "0o600", "platform.db-shm": "0o600", "platform.db-wal": "0o600"}


def test_an_existing_store_file_readable_by_others_is_made_0600(
    tmp_path: Path, umask_022: None
) -> None:
    """A store file an older moonrun left 0644 is 0600 once the store opens it again."""
    FileStore(tmp_path / "platform.db").close()
    (tmp_path / "platform.db").chmod(0o644)
    FileStore(tmp_path / "platform.db").close()
    assert modes_under(tmp_path) == {"platform.db": "0o600"}


def test_artifact_chunks_are_0600_in_0700_directories_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    """Every directory from the artifact root down is 0700, every chunk, marker and count 0600."""
    root = tmp_path / "data" / "artifacts"
    artifacts = FileArtifactStore(root)
    artifacts.put_chunk("job-1", 1, "report.txt", 0, b"first", final=False)
    artifacts.put_chunk("job-1", 1, "report.txt", 1, b"last", final=True)
    assert modes_under(tmp_path) == {
        "data": "0o700",
        "data/artifacts": "0o700",
        "data/artifacts/job-1": "0o700",
        "data/artifacts/job-1/1": "0o700",
        "data/artifacts/job-1/1/.held": "0o600",
        "data/artifacts/job-1/1/report.txt": "0o700",
        "data/artifacts/job-1/1/report.txt/000000.chunk": "0o600",
        "data/artifacts/job-1/1/report.txt/000001.chunk": "0o600",
        "data/artifacts/job-1/1/report.txt/final": "0o600",
    }
