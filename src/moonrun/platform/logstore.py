"""The log store: a bounded, in-memory store of log lines per attempt (not durable, by design).

Each attempt keeps its newest `max_lines_per_attempt` lines; the least recently written
attempts are forgotten beyond `max_attempts`. Batches are idempotent per (job, attempt, seq).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LogLine:
    seq: int
    ts: str
    stream: str
    text: str


class LogStore(Protocol):
    def append(self, job_id: str, attempt: int, seq: int, lines: list[LogLine]) -> int:
        """Store a batch once; returns the highest batch seq accepted for the attempt."""
        ...

    def read(self, job_id: str, attempt: int, after_seq: int) -> list[LogLine]: ...

    def attempts(self, job_id: str) -> list[int]:
        """Attempts of the job that have lines, ascending."""
        ...


@dataclass
class _AttemptLog:
    lines: deque[LogLine]
    seqs: set[int] = field(default_factory=set)
    highest: int = -1


class MemoryLogStore:
    """Bounded log lines in memory; what a restart loses is only logs (docs/roadmap.md)."""

    def __init__(self, max_lines_per_attempt: int = 10_000, max_attempts: int = 10_000) -> None:
        self._max_lines = max_lines_per_attempt
        self._max_attempts = max_attempts
        self._logs: OrderedDict[tuple[str, int], _AttemptLog] = OrderedDict()
        self._lock = threading.Lock()

    def append(self, job_id: str, attempt: int, seq: int, lines: list[LogLine]) -> int:
        with self._lock:
            key = (job_id, attempt)
            log = self._logs.get(key)
            if log is None:
                log = self._logs[key] = _AttemptLog(deque(maxlen=self._max_lines))
                while len(self._logs) > self._max_attempts:
                    self._logs.popitem(last=False)
            self._logs.move_to_end(key)
            if seq not in log.seqs:
                log.seqs.add(seq)
                log.lines.extend(lines)
                log.highest = max(log.highest, seq)
            return log.highest

    def read(self, job_id: str, attempt: int, after_seq: int) -> list[LogLine]:
        with self._lock:
            log = self._logs.get((job_id, attempt))
            return [] if log is None else [line for line in log.lines if line.seq > after_seq]

    def attempts(self, job_id: str) -> list[int]:
        with self._lock:
            return sorted(attempt for (job, attempt) in self._logs if job == job_id)
