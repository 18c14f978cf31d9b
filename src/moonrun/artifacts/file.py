"""The artifact store on disk: chunks of named artifacts per attempt, as files under the data
directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

from moonrun.artifacts.protocol import ATTEMPT_BYTES, MAX_CHUNKS, NAME_PATTERN, ArtifactInfo
from moonrun.errors import ArtifactConflict, ArtifactTooLarge, InvalidRequest, StoreUnavailable
from moonrun.security.files import open_private, private_directory

COUNTED_ATTEMPTS = 4096
"""Attempts whose artifact bytes are kept counted in memory."""


class FileArtifactStore:
    """`<root>/<job>/<attempt>/<name>/<index>.chunk`, written atomically; `final` marks the end.

    An attempt's chunks, over all its artifacts, hold at most `attempt_bytes`: one Run's
    uploads cannot fill the disk every other owner's artifacts share. The bytes an attempt
    holds are counted in memory, from its chunk files on disk when first touched (so that a
    restart does not reset the count), for the most recently touched `counted_attempts`.
    """

    def __init__(
        self,
        root: Path,
        *,
        attempt_bytes: int = ATTEMPT_BYTES,
        counted_attempts: int = COUNTED_ATTEMPTS,
    ) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._attempt_bytes = attempt_bytes
        self._counted_attempts = counted_attempts
        self._held: OrderedDict[tuple[str, int], int] = OrderedDict()

    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        if not NAME_PATTERN.match(name):
            raise InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
        if not 0 <= index < MAX_CHUNKS:
            raise InvalidRequest(f"chunk index must be from 0 to {MAX_CHUNKS - 1}")
        directory = self._root / job_id / str(attempt) / name
        chunk = directory / f"{index:06d}.chunk"
        with self._lock:
            if chunk.exists():
                stored = hashlib.sha256(chunk.read_bytes()).digest()
                if stored != hashlib.sha256(data).digest():
                    raise ArtifactConflict(f"chunk {index} of {name} was stored with other bytes")
            else:
                held = self._bytes_held(job_id, attempt)
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
                except OSError as error:
                    raise self._unwritable(error) from None
                self._held[(job_id, attempt)] = held + len(data)
            if final:
                try:
                    _write(directory / "final", f"{index + 1}\n".encode())
                except OSError as error:
                    raise self._unwritable(error) from None

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
            for attempt in range(1, attempts + 1):
                self._held.pop((job_id, attempt), None)
            try:
                shutil.rmtree(self._root / job_id)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise StoreUnavailable(
                    f"cannot delete artifacts under {self._root}: {error.strerror}"
                ) from None

    def _bytes_held(self, job_id: str, attempt: int) -> int:
        """The bytes of the attempt's stored chunks (under the lock)."""
        key = (job_id, attempt)
        if key in self._held:
            self._held.move_to_end(key)
            return self._held[key]
        held = sum(
            path.stat().st_size for path in (self._root / job_id / str(attempt)).glob("*/*.chunk")
        )
        self._held[key] = held
        if len(self._held) > self._counted_attempts:
            self._held.popitem(last=False)  # counted again from disk when touched again
        return held


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


def _write(path: Path, data: bytes) -> None:
    """Write `path` 0600 and sync it (chunks are job output: nobody else's to read)."""
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
