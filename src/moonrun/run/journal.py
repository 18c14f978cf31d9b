"""The journal: Run's held attempts, as an append-only log in the data directory.

`journal.log` holds a header line, then one line per change: the whole assignment as it now
is, or the job id it no longer holds; each line carries its own checksum (CRC-32 of its
JSON). A change thus costs one short append, however many attempts Run holds. Changes asked
for in the same event-loop turn share one write and one fsync, done off the event loop (group
commit); changes asked for while a write is on its way share the next one.

The first write of a process, and any write once the log holds many more lines than live
entries, rewrites the log with only the live entries instead (temporary file, fsync, rename,
directory fsync). That also drops a torn last line and carries over a `journal.json` left by an
older Run, which is then removed.

Opening only reads. A torn last line (a crash in the middle of an append, which was never
acknowledged) is ignored; any other damage is `JournalCorrupt`, and the file is left as it is,
never silently treated as empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moonrun.errors import JournalCorrupt
from moonrun.run.batcher import Batcher

FILE_NAME = "journal.log"
FORMAT = "moonrun-journal/2"
OLD_FILE_NAME = "journal.json"
OLD_FORMAT = "moonrun-journal/1"
COMPACT_MIN_LINES = 1024
"""Never rewrite a log shorter than this: rewriting costs as much as this many appends."""
COMPACT_RATIO = 4
"""Rewrite once the log holds this many times more lines than live entries."""


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
    """The result to deliver (outcome, retryable, error, output, and `silent` when the attempt
    printed no log line), kept until accepted."""
    process: dict[str, Any] | None = None
    """What a handler started for this attempt (`pgid` and the leader's start time in clock
    ticks; for `command` also its cgroup, working directory and session: run/leftovers.py),
    so that a restarted Run can stop what its predecessor left behind."""
    notes: list[str] = field(default_factory=list)
    owner_id: str | None = None
    """The job's owner, as the claim said (absent from a platform older than this Run)."""


class Journal:
    """The assignments, keyed by job id, and their log.

    Change `entries` only through `put` and `drop`; each returns a future that is done once
    the change (and every change asked for before it) is on disk. Await it where durability
    matters; leave it where a lost change is harmless.
    """

    def __init__(
        self,
        data_dir: Path,
        entries: dict[str, Assignment] | None = None,
        *,
        lines: int = 0,
        compact_min: int = COMPACT_MIN_LINES,
    ) -> None:
        self.path = data_dir / FILE_NAME
        self.entries: dict[str, Assignment] = entries or {}
        self._lines = lines
        self._compact_min = compact_min
        self._changed: set[str] = set()
        self._rewrite = True  # the first write of a process starts a fresh log
        self._fd: int | None = None
        # Waiters carry no data: however many there are, one write serves them all.
        self._commits: Batcher[None, None] = Batcher(self._commit, max_items=sys.maxsize)

    @classmethod
    def open(cls, data_dir: Path, *, compact_min: int = COMPACT_MIN_LINES) -> Journal:
        """Read the journal (an older Run's `journal.json` if there is no log yet); writes
        nothing."""
        path, old = data_dir / FILE_NAME, data_dir / OLD_FILE_NAME
        try:
            if path.exists():
                entries, lines = _read_log(path.read_bytes())
            elif old.exists():
                path, lines = old, 0
                entries = _read_old(old.read_bytes())
            else:
                return cls(data_dir, compact_min=compact_min)
        except (ValueError, KeyError, TypeError) as error:
            raise JournalCorrupt(
                f"journal {path} is damaged ({error}); it was left untouched. Move it aside to "
                "start afresh: the platform will retry the jobs it held."
            ) from None
        return cls(data_dir, entries, lines=lines, compact_min=compact_min)

    # -- changes ---------------------------------------------------------------------------

    def put(self, *entries: Assignment) -> asyncio.Future[None]:
        """Hold these assignments as they are now."""
        for entry in entries:
            self.entries[entry.job_id] = entry
            self._changed.add(entry.job_id)
        return self.sync()

    def drop(self, job_id: str) -> asyncio.Future[None]:
        """No longer hold `job_id`."""
        if self.entries.pop(job_id, None) is not None:
            self._changed.add(job_id)
        return self.sync()

    def sync(self) -> asyncio.Future[None]:
        """Done once every change asked for so far is on disk."""
        future = self._commits.submit(None)
        future.add_done_callback(_retrieved)
        return future

    async def close(self) -> None:
        """Write what is pending, then let go of the log file."""
        await self._commits.idle()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def rewrite(self) -> None:
        """Write the live entries into a fresh log now (blocking; also for tools and tests)."""
        self._changed.clear()
        self._write(self._snapshot(), fresh=True)

    # -- writing ---------------------------------------------------------------------------

    async def _commit(self, waiters: list[None]) -> list[None]:
        """One write for every change asked for until now (the serialising happens here, on
        the event loop; the writing and syncing in a thread)."""
        changed, self._changed = self._changed, set()
        fresh = self._rewrite or self._lines + len(changed) > max(
            self._compact_min, COMPACT_RATIO * len(self.entries)
        )
        if fresh:
            data = self._snapshot()
        else:
            data = b"".join(_line(self._record(job_id)) for job_id in changed)
        if data:
            await asyncio.to_thread(self._write, data, fresh=fresh)
        return [None] * len(waiters)

    def _record(self, job_id: str) -> dict[str, Any]:
        entry = self.entries.get(job_id)
        return {"drop": job_id} if entry is None else {"put": asdict(entry)}

    def _snapshot(self) -> bytes:
        lines = [_line({"format": FORMAT})]
        lines.extend(_line({"put": asdict(entry)}) for entry in self.entries.values())
        return b"".join(lines)

    def _write(self, data: bytes, *, fresh: bool) -> None:
        # One writer at a time: the batcher sends one batch at a time, and `moonrun run start`
        # holds the data directory's lock.
        self._rewrite = True  # until this write is known complete: never append after a tear
        if fresh:
            self._replace(data)
            self._lines = data.count(b"\n") - 1
        else:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            _write_all(self._fd, data)
            os.fsync(self._fd)
            self._lines += data.count(b"\n")
        self._rewrite = False

    def _replace(self, data: bytes) -> None:
        """Atomically and durably replace the log with `data`; remove an older journal."""
        temporary = self.path.with_name(FILE_NAME + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(descriptor, data)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        os.replace(temporary, self.path)
        _sync_directory(self.path.parent)
        old = self.path.with_name(OLD_FILE_NAME)
        if old.exists():  # only once the log that replaces it is durable
            old.unlink()
            _sync_directory(self.path.parent)


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _read_log(data: bytes) -> tuple[dict[str, Assignment], int]:
    """The entries a log holds, and how many change lines it has."""
    lines = data.split(b"\n")
    # Only the last line may be torn: a crash in the middle of its (unacknowledged) append.
    # A damaged line with intact ones after it is not what a torn append leaves on common file
    # systems (they keep a prefix of it): that is reported, never skipped.
    last = len(lines) - 1
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines):
        record = _parse(line)
        if record is None:
            if number == last or (number == last - 1 and lines[last] == b"" and number > 0):
                break
            raise ValueError(f"line {number + 1} of {len(lines) - 1} fails its checksum")
        records.append(record)
    if not records or records[0].get("format") != FORMAT:
        raise ValueError("not a moonrun journal log")
    entries: dict[str, Assignment] = {}
    for record in records[1:]:
        if "put" in record:
            entry = Assignment(**record["put"])
            entries[entry.job_id] = entry
        else:
            entries.pop(record["drop"], None)
    return entries, len(records) - 1


def _parse(line: bytes) -> dict[str, Any] | None:
    """A line's record; None when its checksum does not hold."""
    checksum, _, body = line.partition(b" ")
    if len(checksum) != 8 or not body:
        return None
    try:
        if int(checksum, 16) != zlib.crc32(body):
            return None
    except ValueError:
        return None
    record = json.loads(body)
    if not isinstance(record, dict):
        raise ValueError("a line that is not a record")
    return record


def _read_old(data: bytes) -> dict[str, Assignment]:
    """The entries of an older Run's `journal.json` (written whole, with one checksum)."""
    document = json.loads(data)
    entries = document["entries"]
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    if document.get("format") != OLD_FORMAT or (
        hashlib.sha256(canonical).hexdigest() != document["sha256"]
    ):
        raise ValueError("checksum or format mismatch")
    return {item["job_id"]: Assignment(**item) for item in entries}


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _sync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a write error as seen: a change nobody awaited was one allowed to be lost, and
    the next write rewrites the whole log anyway."""
    if not future.cancelled():
        future.exception()
