"""The narrow seam every artifact store implements: an attempt's named artifacts, stored once
chunk by chunk and read back by chunk (docs/protocol.md, "Artifacts")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""An artifact's name (Run's `command` handler checks the same rule at submit)."""
MAX_CHUNKS = 100_000
"""Chunk indexes are 0 to MAX_CHUNKS - 1."""
ATTEMPT_BYTES = 2 * 1024**3
"""The platform's default cap on an attempt's artifact bytes (`--artifact-attempt-bytes`)."""


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    """One stored artifact of one attempt, as the user API lists it."""

    attempt: int
    name: str
    size: int
    """The bytes of its stored chunks."""
    chunks: int
    """The chunk count its `final` marker holds, or the chunks stored so far."""
    complete: bool
    """The `final` marker is there and every chunk it counts is stored."""
    chunk_sizes: tuple[int, ...] = ()
    """The size of each chunk in order, when complete."""


class ArtifactStore(Protocol):
    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        """Store chunk `index` once; the same bytes again are fine, different bytes are not."""
        ...

    def artifacts(self, job_id: str) -> list[ArtifactInfo]:
        """The job's artifacts, by attempt then name."""
        ...

    def read_chunk(self, job_id: str, attempt: int, name: str, index: int) -> bytes:
        """Chunk `index` of a stored artifact."""
        ...

    def delete_job(self, job_id: str, attempts: int) -> None:
        """Delete every artifact of the job's attempts 1 to `attempts` (the job was deleted)."""
        ...


@dataclass(frozen=True, slots=True)
class ArtifactLimits:
    """Bounds of the artifact store (docs/protocol.md, "Artifacts"); the wiring
    (`wiring/settings.py`) hands them to `FileArtifactStore`."""

    attempt_bytes: int = ATTEMPT_BYTES
    """An attempt's chunks, over all its artifacts; a chunk past it is 413 artifact_too_large."""
