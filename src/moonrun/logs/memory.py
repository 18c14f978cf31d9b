"""The log store in memory: bounded log lines per attempt (`file.py` makes them durable).

Every bound is a constructor argument (`wiring/settings.py` sets them from `LogLimits`). A line's
text is cut to `line_bytes` of UTF-8 with a visible marker. An attempt keeps its newest lines
within `attempt_lines` and `attempt_bytes`; the whole store keeps `total_bytes`, forgetting the
oldest lines of the least recently written attempts first; at most `max_attempts` attempts are
remembered. Lines dropped for a bound are counted on their attempt. Batches are idempotent per
(job, attempt, seq), also once their lines were dropped.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from moonrun.logs.protocol import LogLine, LogPage

LINE_RECORD_BYTES = 100
"""What a stored line costs beside its text (its record, `ts`, `stream`), for `total_bytes`."""


def clean_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD: what cannot be encoded is never
    stored, so no reader of the store can fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def cut_text(text: str, max_bytes: int) -> tuple[str, int]:
    """`text` cut to `max_bytes` of UTF-8 (never half a character) with a marker saying how
    many bytes went; and its size in bytes as stored."""
    if text.isascii():
        if len(text) <= max_bytes:
            return text, len(text)
        data = text.encode("ascii")
    else:
        text = clean_text(text)
        data = text.encode("utf-8")
        if len(data) <= max_bytes:
            return text, len(data)
    kept = data[:max_bytes].decode("utf-8", "ignore")
    cut = f"{kept}… [truncated {len(data) - len(kept.encode('utf-8'))} bytes]"
    return cut, len(cut.encode("utf-8"))


@dataclass
class _AttemptLog:
    batches: dict[int, deque[tuple[LogLine, int]]] = field(default_factory=dict)
    """Stored lines by batch seq, each with its text's size in bytes."""
    order: list[int] = field(default_factory=list)
    """The seqs of `batches`, ascending."""
    floor: int = -1
    """The highest seq whose lines were all dropped: a batch at or below it is not stored."""
    highest: int = -1
    lines: int = 0
    bytes: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    complete: bool = False
    """Its final batch is stored: no more lines will come."""

    @property
    def has_lines(self) -> bool:
        """It holds lines, or held some (only a bound takes them away)."""
        return self.lines > 0 or self.dropped_lines > 0


class MemoryLogStore:
    """Bounded log lines in memory; what a restart loses is only logs (docs/roadmap.md)."""

    on_threads = False

    def __init__(
        self,
        *,
        line_bytes: int = 16 * 1024,
        attempt_bytes: int = 4 * 1024 * 1024,
        attempt_lines: int = 10_000,
        total_bytes: int = 256 * 1024 * 1024,
        max_attempts: int = 10_000,
        page_bytes: int = 1024 * 1024,
    ) -> None:
        self._line_bytes = line_bytes
        self._attempt_bytes = attempt_bytes
        self._attempt_lines = attempt_lines
        self._total_bytes = total_bytes
        self._max_attempts = max_attempts
        self._page_bytes = page_bytes
        self._bytes = 0
        self._logs: OrderedDict[tuple[str, int], _AttemptLog] = OrderedDict()
        self._lock = threading.Lock()

    def append(
        self, job_id: str, attempt: int, seq: int, lines: list[LogLine], *, final: bool = False
    ) -> int:
        stored = self._prepare(seq, lines)
        with self._lock:
            log = self._attempt_log((job_id, attempt))
            log.complete = log.complete or final
            if seq in log.batches or seq <= log.floor:
                return log.highest
            self._store(log, seq, stored)
            self._keep_total()
            return log.highest

    def complete(self, job_id: str, attempt: int) -> bool:
        with self._lock:
            log = self._logs.get((job_id, attempt))
            return log is not None and log.complete

    def _prepare(self, seq: int, lines: list[LogLine]) -> deque[tuple[LogLine, int]]:
        """The batch's lines as stored: text cut and cleaned, each with its size in bytes."""
        stored: deque[tuple[LogLine, int]] = deque()
        for line in lines:
            text, size = cut_text(line.text, self._line_bytes)
            ts, stream = clean_text(line.ts), clean_text(line.stream)
            stored.append((LogLine(seq, ts, stream, text), size))
        return stored

    def _attempt_log(self, key: tuple[str, int]) -> _AttemptLog:
        """The attempt's log, made most recently written (under the lock)."""
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _AttemptLog()
            while len(self._logs) > self._max_attempts:
                forgotten_key, forgotten = self._logs.popitem(last=False)
                self._bytes -= forgotten.bytes + forgotten.lines * LINE_RECORD_BYTES
                self._forget(forgotten_key)
        self._logs.move_to_end(key)
        return log

    def _forget(self, key: tuple[str, int]) -> None:
        """An attempt left the store for `max_attempts` (a durable store deletes its file)."""

    def _store(self, log: _AttemptLog, seq: int, stored: deque[tuple[LogLine, int]]) -> None:
        """Keep a new batch within the attempt's caps (under the lock)."""
        log.highest = max(log.highest, seq)
        if stored:
            bisect.insort(log.order, seq)
            log.batches[seq] = stored
            size = sum(s for _, s in stored)
            log.lines += len(stored)
            log.bytes += size
            self._bytes += size + len(stored) * LINE_RECORD_BYTES
            while log.lines > self._attempt_lines or log.bytes > self._attempt_bytes:
                self._drop_oldest(log)

    def read(self, job_id: str, attempt: int, after_seq: int, limit: int = 1000) -> LogPage:
        with self._lock:
            log = self._logs.get((job_id, attempt))
            if log is None:
                return LogPage(attempt, [], after_seq, False)
            page: list[LogLine] = []
            size, last, more = 0, after_seq, False
            for index in range(bisect.bisect_right(log.order, after_seq), len(log.order)):
                batch = log.batches[log.order[index]]
                batch_size = sum(s for _, s in batch)
                if page and (
                    len(page) + len(batch) > limit or size + batch_size > self._page_bytes
                ):
                    more = True
                    break
                page.extend(line for line, _ in batch)
                size, last = size + batch_size, log.order[index]
            return self._page(attempt, log, page, last, more)

    def tail(self, job_id: str, attempt: int, count: int, after_seq: int = -1) -> LogPage:
        with self._lock:
            log = self._logs.get((job_id, attempt))
            if log is None:
                return LogPage(attempt, [], after_seq, False)
            newest: list[LogLine] = []
            size = 0
            first = bisect.bisect_right(log.order, after_seq)
            for index in range(len(log.order) - 1, first - 1, -1):
                for line, line_size in reversed(log.batches[log.order[index]]):
                    if len(newest) == count or (newest and size + line_size > self._page_bytes):
                        break
                    newest.append(line)
                    size += line_size
            newest.reverse()
            last = newest[-1].seq if newest else after_seq
            return self._page(attempt, log, newest, last, False)

    def attempts(self, job_id: str) -> list[int]:
        with self._lock:
            return sorted(
                attempt
                for (job, attempt), log in self._logs.items()
                if job == job_id and log.has_lines
            )

    def delete_job(self, job_id: str, attempts: int) -> None:
        with self._lock:
            for attempt in range(1, attempts + 1):
                key = (job_id, attempt)
                log = self._logs.pop(key, None)
                if log is not None:
                    self._bytes -= log.bytes + log.lines * LINE_RECORD_BYTES
                    self._forget(key)

    @staticmethod
    def _page(
        attempt: int, log: _AttemptLog, lines: list[LogLine], last: int, more: bool
    ) -> LogPage:
        return LogPage(attempt, lines, last, more, log.lines, log.dropped_lines, log.dropped_bytes)

    def _drop_oldest(self, log: _AttemptLog) -> None:
        seq = log.order[0]
        batch = log.batches[seq]
        _, size = batch.popleft()
        log.lines -= 1
        log.bytes -= size
        log.dropped_lines += 1
        log.dropped_bytes += size
        self._bytes -= size + LINE_RECORD_BYTES
        if not batch:
            del log.batches[seq]
            log.order.pop(0)
            log.floor = max(log.floor, seq)

    def _keep_total(self) -> None:
        """Drop the oldest lines of the least recently written attempts until within bounds."""
        for key, log in self._logs.items():
            dropped = 0
            while self._bytes > self._total_bytes and log.lines:
                self._drop_oldest(log)
                dropped += 1
            if dropped:
                self._dropped_for_total(key, dropped)
            if self._bytes <= self._total_bytes:
                return

    def _dropped_for_total(self, key: tuple[str, int], count: int) -> None:
        """The store-wide cap took `count` oldest lines of an attempt (a durable store notes it:
        unlike the attempt's own caps, replaying its batches would not take them again)."""
