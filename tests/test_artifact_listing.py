"""How the file artifact store lists an attempt's artifact: chunks stored so far until the
`final` marker, then complete only once every chunk it counts is there, with each chunk's
size in order; a marker that holds no count is not an end; a chunk that cannot be written is
a 503 naming where."""

from __future__ import annotations

from pathlib import Path

import pytest

from moonrun.artifacts import file as artifact_file
from moonrun.artifacts.file import FileArtifactStore
from moonrun.artifacts.protocol import ArtifactInfo
from moonrun.errors import StoreUnavailable


def listing(store: FileArtifactStore) -> list[ArtifactInfo]:
    return store.artifacts("job_1")


def test_an_artifact_without_its_final_chunk_lists_the_chunks_stored_so_far(
    tmp_path: Path,
) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    store.put_chunk("job_1", 1, "out", 2, b"de", False)
    assert listing(store) == [ArtifactInfo(1, "out", 5, 2, False, ())]


def test_a_final_artifact_is_complete_with_each_chunks_size_in_order(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", 1, b"de", False)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    store.put_chunk("job_1", 1, "out", 2, b"f", True)
    assert listing(store) == [ArtifactInfo(1, "out", 6, 3, True, (3, 2, 1))]


def test_a_final_chunk_sent_before_others_is_not_complete_until_they_arrive(
    tmp_path: Path,
) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", 2, b"f", True)
    waiting = listing(store)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    store.put_chunk("job_1", 1, "out", 1, b"de", False)
    assert (waiting, listing(store)) == (
        [ArtifactInfo(1, "out", 1, 3, False, ())],
        [ArtifactInfo(1, "out", 6, 3, True, (3, 2, 1))],
    )


def test_an_empty_artifact_is_one_empty_final_chunk(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "empty", 0, b"", True)
    assert listing(store) == [ArtifactInfo(1, "empty", 0, 1, True, (0,))]


@pytest.mark.parametrize("marker", ["", "three", "-1"])
def test_a_final_marker_without_a_count_is_no_end(tmp_path: Path, marker: str) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    (tmp_path / "job_1" / "1" / "out" / "final").write_text(marker + "\n")
    assert listing(store) == [ArtifactInfo(1, "out", 3, 1, False, ())]


def test_a_final_marker_counting_no_chunk_is_complete_and_empty(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    (tmp_path / "job_1" / "1" / "out" / "final").write_text("0\n")
    assert listing(store) == [ArtifactInfo(1, "out", 3, 0, True, ())]


def test_a_chunk_that_cannot_be_written_is_unavailable_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifact_file, "_write", full)
    store = FileArtifactStore(tmp_path / "artifacts")
    with pytest.raises(StoreUnavailable) as raised:
        store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    assert raised.value.message == (
        f"cannot write artifacts under {tmp_path / 'artifacts'}: No space left on device"
    )
