"""The journal: Run's active assignments, in one file of the data directory.

Written atomically (temporary file, fsync, rename, fsync of the directory) and checksummed,
so a crash leaves either the old journal or the new one; anything else (a torn or edited
file) is reported as `JournalCorrupt` and never silently treated as empty.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moonrun.errors import MoonrunError

FILE_NAME = "journal.json"
FORMAT = "moonrun-journal/1"


class JournalCorrupt(MoonrunError):
    """The journal is damaged; it is kept as it is for inspection."""


@dataclass
class Assignment:
    """One attempt Run holds: everything needed to resume it or to finish reporting it."""

    job_id: str
    attempt: int
    lease: str
    kind: str
    payload: Any
    server_id: str
    state: str = "accepted"
    """`accepted` (journaled, ack not yet accepted), `running`, `finished` (result not yet
    accepted by the platform), or `self_fenced` (Run stopped it: its lease could be gone)."""
    started_at_ms: int | None = None
    progress_seq: int = 0
    result: dict[str, Any] | None = None
    """The result to deliver (outcome, retryable, error, output), kept until accepted."""
    process: dict[str, int] | None = None
    """The process group a handler started for this attempt (`pgid`, and the leader's start
    time in clock ticks), so that a restarted Run can stop what its predecessor left behind."""
    notes: list[str] = field(default_factory=list)


class Journal:
    """The assignments, keyed by job id, and their one file."""

    def __init__(self, path: Path, entries: dict[str, Assignment] | None = None) -> None:
        self.path = path
        self.entries: dict[str, Assignment] = entries or {}

    @classmethod
    def open(cls, data_dir: Path) -> Journal:
        path = data_dir / FILE_NAME
        if not path.exists():
            return cls(path)
        try:
            document = json.loads(path.read_bytes())
            entries = document["entries"]
            if document.get("format") != FORMAT or _checksum(entries) != document["sha256"]:
                raise ValueError("checksum or format mismatch")
            loaded = {item["job_id"]: Assignment(**item) for item in entries}
        except (ValueError, KeyError, TypeError) as error:
            raise JournalCorrupt(
                f"journal {path} is damaged ({error}); it was left untouched. Move it aside to "
                "start afresh: the platform will retry the jobs it held."
            ) from None
        return cls(path, loaded)

    def snapshot(self) -> bytes:
        entries = [asdict(entry) for entry in self.entries.values()]
        document = {"format": FORMAT, "entries": entries, "sha256": _checksum(entries)}
        return json.dumps(document, separators=(",", ":")).encode()

    def write(self, snapshot: bytes) -> None:
        """Replace the file with `snapshot`, atomically and durably."""
        # One writer at a time: `moonrun run start` holds the data directory's lock.
        temporary = self.path.with_name(self.path.name + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(snapshot)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _checksum(entries: list[dict[str, Any]]) -> str:
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
