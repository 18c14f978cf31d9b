"""The narrow seam every log store implements: batches of an attempt's lines in, pages and
tails out, within the bounds of `LogLimits` (docs/protocol.md, "Log bounds", "Reading logs").

Batches are idempotent per (job, attempt, seq), also once their lines were dropped for a bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LogLine:
    seq: int
    ts: str
    stream: str
    text: str


@dataclass(frozen=True, slots=True)
class LogPage:
    """Some lines of one attempt, where to go on from, and what the attempt dropped."""

    attempt: int | None
    lines: list[LogLine]
    next_after_seq: int
    """Pass as `after_seq` for the lines after this page (newer ones, for a tail)."""
    more: bool
    """Lines after `next_after_seq` were left off this page."""
    kept_lines: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0


class LogStore(Protocol):
    on_threads: bool
    """Appends wait for the disk: run them on the logs channel's threads, never inline."""

    def append(
        self, job_id: str, attempt: int, seq: int, lines: list[LogLine], *, final: bool = False
    ) -> int:
        """Store a batch once; returns the highest batch seq accepted for the attempt. `final`:
        Run says this is the attempt's last batch (it may hold no line), so its logs are
        complete once it is stored (again: a final batch sent again still says so)."""
        ...

    def complete(self, job_id: str, attempt: int) -> bool:
        """Whether the attempt's final batch is stored (docs/protocol.md, "Sending logs")."""
        ...

    def read(self, job_id: str, attempt: int, after_seq: int, limit: int = 1000) -> LogPage:
        """Whole batches after `after_seq`, in seq order, up to `limit` lines (at least one
        batch)."""
        ...

    def tail(self, job_id: str, attempt: int, count: int, after_seq: int = -1) -> LogPage:
        """The newest `count` lines after `after_seq`."""
        ...

    def attempts(self, job_id: str) -> list[int]:
        """Attempts of the job that have lines (or had them), ascending (a final batch without
        lines makes none)."""
        ...

    def delete_job(self, job_id: str, attempts: int) -> None:
        """Forget every line of the job's attempts 1 to `attempts` (the job was deleted)."""
        ...


@dataclass(frozen=True, slots=True)
class LogLimits:
    """Bounds every log store keeps (docs/protocol.md, "Log bounds"); the wiring
    (`wiring/settings.py`) hands them to `MemoryLogStore` or `FileLogStore`."""

    line_bytes: int = 16 * 1024
    """A longer line is cut to this many bytes of UTF-8, with a marker naming what went."""
    attempt_bytes: int = 4 * 1024 * 1024
    """An attempt keeps its newest lines within this many bytes of text (older ones counted)."""
    attempt_lines: int = 10_000
    total_bytes: int = 256 * 1024 * 1024
    """The whole store, counting each line's record too; the least recently written attempts
    lose their oldest lines first."""
    max_attempts: int = 10_000
