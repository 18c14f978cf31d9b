"""How the file artifact store lists an attempt's artifact: chunks stored so far until the
`final` marker, then complete only once every chunk it counts is there, with each chunk's
size in order; a marker that holds no count is not an end; a chunk that cannot be written is
a 503 naming where."""

from __future__ import annotations

from pathlib import Path

import pytest

from moonrun.artifacts import file as artifact_file
from moonrun.artifacts.file import FileArtifactStore
from moonrun.artifacts.protocol import MAX_CHUNKS, ArtifactInfo
from moonrun.errors import ArtifactConflict, ArtifactTooLarge, InvalidRequest, StoreUnavailable


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


def test_artifacts_are_listed_by_attempt_then_name_skipping_what_the_store_did_not_make(
    tmp_path: Path,
) -> None:
    store = FileArtifactStore(tmp_path)
    for attempt, name in [(2, "b"), (1, "z"), (2, "a"), (1, "c")]:
        store.put_chunk("job_1", attempt, name, 0, b"x", True)
    (tmp_path / "job_1" / "notes").mkdir()  # not an attempt
    (tmp_path / "job_1" / "1" / "stray.txt").write_text("a file, not an artifact")
    listed = [(info.attempt, info.name) for info in listing(store)]
    assert listed == [(1, "c"), (1, "z"), (2, "a"), (2, "b")]


def test_the_last_chunk_index_is_accepted_and_one_more_is_refused(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 1, "out", MAX_CHUNKS - 1, b"x", False)
    with pytest.raises(InvalidRequest) as raised:
        store.put_chunk("job_1", 1, "out", MAX_CHUNKS, b"x", False)
    assert raised.value.message == f"chunk index must be from 0 to {MAX_CHUNKS - 1}"


def test_refusals_say_which_chunk_and_why(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path, attempt_bytes=4)
    store.put_chunk("job_1", 1, "out", 0, b"abc", False)
    said = []
    for name, index, data in [("../x", 0, b"a"), ("out", 0, b"abd"), ("out", 1, b"de")]:
        with pytest.raises((InvalidRequest, ArtifactConflict, ArtifactTooLarge)) as raised:
            store.put_chunk("job_1", 1, name, index, data, False)
        said.append(raised.value.message)
    assert said == [
        "artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        "chunk 0 of out was stored with other bytes",
        "chunk 1 of out would take attempt 1's artifacts past the platform's cap of 4 bytes",
    ]


def test_a_final_marker_that_cannot_be_written_is_unavailable_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk is stored; its end is not: Run sends it again and it lands then."""
    real_write = artifact_file._write

    def full_at_the_marker(path: Path, data: bytes) -> None:
        if path.name in ("final", ".final.tmp"):  # written aside, then renamed
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(artifact_file, "_write", full_at_the_marker)
    store = FileArtifactStore(tmp_path / "artifacts")
    with pytest.raises(StoreUnavailable) as raised:
        store.put_chunk("job_1", 1, "out", 0, b"abc", True)
    assert raised.value.message == (
        f"cannot write artifacts under {tmp_path / 'artifacts'}: No space left on device"
    )
    assert store.artifacts("job_1") == [ArtifactInfo(1, "out", 3, 1, False, ())]
