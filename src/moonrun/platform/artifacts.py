"""The artifact store: chunks of named artifacts per attempt, as files under the data directory."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Protocol

from moonrun.errors import ArtifactConflict, InvalidRequest
from moonrun.security.files import open_private, private_directory

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_CHUNKS = 100_000


class ArtifactStore(Protocol):
    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        """Store chunk `index` once; the same bytes again are fine, different bytes are not."""
        ...


class FileArtifactStore:
    """`<root>/<job>/<attempt>/<name>/<index>.chunk`, written atomically; `final` marks the end."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()

    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        if not NAME_PATTERN.match(name):
            raise InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
        if not 0 <= index < MAX_CHUNKS:
            raise InvalidRequest(f"chunk index must be from 0 to {MAX_CHUNKS - 1}")
        directory = self._root / job_id / str(attempt) / name
        private_directory(directory)
        chunk = directory / f"{index:06d}.chunk"
        with self._lock:
            if chunk.exists():
                stored = hashlib.sha256(chunk.read_bytes()).digest()
                if stored != hashlib.sha256(data).digest():
                    raise ArtifactConflict(f"chunk {index} of {name} was stored with other bytes")
            else:
                temporary = directory / f".{index:06d}.tmp"
                _write(temporary, data)
                os.replace(temporary, chunk)
            if final:
                _write(directory / "final", f"{index + 1}\n".encode())


def _write(path: Path, data: bytes) -> None:
    """Write `path` 0600 and sync it (chunks are job output: nobody else's to read)."""
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
