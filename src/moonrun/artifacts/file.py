"""The artifact store on disk: chunks of named artifacts per attempt, as files under the data
directory, which several platform processes may share (docs/operations.md, "Several
platforms")."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from moonrun.artifacts.protocol import ATTEMPT_BYTES, MAX_CHUNKS, NAME_PATTERN, ArtifactInfo
from moonrun.errors import ArtifactConflict, ArtifactTooLarge, InvalidRequest, StoreUnavailable
from moonrun.security.files import open_private, private_directory

HELD_FILE = ".held"
"""An attempt's lock file, which holds the bytes of its stored chunks (decimal)."""


class FileArtifactStore:
    """`<root>/<job>/<attempt>/<name>/<index>.chunk`, written atomically; `final` marks the end.

    An attempt's chunks, over all its artifacts, hold at most `attempt_bytes`: one Run's
    uploads cannot fill the disk every other owner's artifacts share. Nothing is kept in
    memory: a chunk is stored holding the attempt's lock file (`<attempt>/.held`, `flock`),
    which also counts the bytes its chunks hold, so several platform processes writing one
    attempt's chunks into one shared directory keep the cap together and never write one chunk
    file at once (a listing or download takes no lock: chunks and markers appear by rename).
    """

    def __init__(self, root: Path, *, attempt_bytes: int = ATTEMPT_BYTES) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._attempt_bytes = attempt_bytes

    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        if not NAME_PATTERN.match(name):
            raise InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
        if not 0 <= index < MAX_CHUNKS:
            raise InvalidRequest(f"chunk index must be from 0 to {MAX_CHUNKS - 1}")
        directory = self._root / job_id / str(attempt) / name
        chunk = directory / f"{index:06d}.chunk"
        with self._attempt_locked(job_id, attempt) as held_file:
            if chunk.exists():
                stored = hashlib.sha256(chunk.read_bytes()).digest()
                if stored != hashlib.sha256(data).digest():
                    raise ArtifactConflict(f"chunk {index} of {name} was stored with other bytes")
            else:
                held = self._bytes_held(job_id, attempt, held_file)
                if held + len(data) > self._attempt_bytes:
                    raise ArtifactTooLarge(
                        f"chunk {index} of {name} would take attempt {attempt}'s artifacts past "
                        f"the platform's cap of {self._attempt_bytes} bytes"
                    )
                # A write that fails (a full disk) is 503, never a bug: Run sends the chunk
                # again, and a half-written temporary file or marker is rewritten then.
                try:
                    private_directory(directory)
                    temporary = directory / f".{index:06d}.tmp"
                    _write(temporary, data)
                    os.replace(temporary, chunk)
                    # Counted after the chunk is stored: a crash in between leaves a count
                    # short by one chunk, never a chunk refused for bytes never stored.
                    _write_count(held_file, held + len(data))
                except OSError as error:
                    raise self._unwritable(error) from None
            if final:
                try:
                    # By rename: a listing in another process never reads half a marker.
                    _write(directory / ".final.tmp", f"{index + 1}\n".encode())
                    os.replace(directory / ".final.tmp", directory / "final")
                except OSError as error:
                    raise self._unwritable(error) from None

    @contextlib.contextmanager
    def _attempt_locked(self, job_id: str, attempt: int) -> Iterator[int]:
        """The attempt's lock file, open and locked against every thread and process."""
        directory = self._root / job_id / str(attempt)
        try:
            private_directory(directory)
            descriptor = open_private(directory / HELD_FILE, os.O_RDWR)
        except OSError as error:
            raise self._unwritable(error) from None
        try:
            # Each call opens its own descriptor: the lock keeps this process's other threads
            # out as it keeps other processes out.
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield descriptor
        finally:
            os.close(descriptor)  # lets go of the lock

    def _unwritable(self, error: OSError) -> StoreUnavailable:
        return StoreUnavailable(f"cannot write artifacts under {self._root}: {error.strerror}")

    def artifacts(self, job_id: str) -> list[ArtifactInfo]:
        found = []
        job = self._root / job_id
        if not NAME_PATTERN.match(job_id) or not job.is_dir():
            return []
        for attempt_dir in job.iterdir():
            if not attempt_dir.name.isdigit():
                continue
            for directory in attempt_dir.iterdir():
                if NAME_PATTERN.match(directory.name) and directory.is_dir():
                    found.append(_info(int(attempt_dir.name), directory))
        return sorted(found, key=lambda info: (info.attempt, info.name))

    def read_chunk(self, job_id: str, attempt: int, name: str, index: int) -> bytes:
        return (self._root / job_id / str(attempt) / name / f"{index:06d}.chunk").read_bytes()

    def delete_job(self, job_id: str, attempts: int) -> None:
        if not NAME_PATTERN.match(job_id):
            return  # no directory of ours has that name
        with self._lock:
            try:
                shutil.rmtree(self._root / job_id)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise StoreUnavailable(
                    f"cannot delete artifacts under {self._root}: {error.strerror}"
                ) from None

    def _bytes_held(self, job_id: str, attempt: int, held_file: int) -> int:
        """The bytes of the attempt's stored chunks (holding its lock): its count, or for an
        attempt stored before counts were kept (or a count a crash left empty), its chunk
        files."""
        text = os.pread(held_file, 32, 0).strip()
        if text.isdigit():
            return int(text)
        return sum(
            path.stat().st_size for path in (self._root / job_id / str(attempt)).glob("*/*.chunk")
        )


def _info(attempt: int, directory: Path) -> ArtifactInfo:
    """An artifact directory's listing: complete once `final` names a count of stored chunks."""
    sizes = {
        int(path.stem): path.stat().st_size
        for path in directory.glob("*.chunk")
        if path.stem.isdigit()
    }
    marker = directory / "final"
    count = None
    if marker.exists():
        text = marker.read_text().strip()
        count = int(text) if text.isdigit() else None
    complete = count is not None and all(index in sizes for index in range(count))
    return ArtifactInfo(
        attempt,
        directory.name,
        sum(sizes.values()),
        count if count is not None else len(sizes),
        complete,
        tuple(sizes[index] for index in range(count)) if complete and count else (),
    )


def _write_count(descriptor: int, count: int) -> None:
    data = f"{count}\n".encode()
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, data, 0)


def _write(path: Path, data: bytes) -> None:
    """Write `path` 0600 and sync it (chunks are job output: nobody else's to read)."""
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
