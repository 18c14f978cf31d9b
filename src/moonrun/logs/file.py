"""The log store on disk: the in-memory log store, with each change journalled to a file first.

`<root>/<job>/<attempt>.jsonl`, one JSON record a line, files 0600 in 0700 directories:

- `{"seq": S, "lines": [[ts, stream, text], ...]}` a batch as stored (text already cut), with
  `"final": true` when Run said it was the attempt's last;
- `{"final": true}` a final batch sent again once its seq was stored (or dropped);
- `{"drop": N}` the store-wide cap took the attempt's N oldest lines;
- `{"floor": F, "highest": H, "dropped_lines": L, "dropped_bytes": B, "final": C}` the state a
  compacted file starts from.

A batch's record is written and fsync'd before `append` returns, so before its 202: a batch
the platform acknowledged survives a crash. The attempt caps are applied when a batch is
appended and again, the same way, when its record is replayed, so they need no record. When an
attempt's file grows past twice its size when last rewritten (plus `COMPACT_SLACK`), it is
rewritten (to a temporary file, fsync'd, renamed) as a state record and the kept batches: a
file holds about twice its attempt's kept lines at most.

The files are read back lazily, all of them on the store's first call: the index is the same
as the memory store's (bounded by the same caps), the most recently modified files last.
Appends wait for the disk holding one of `STRIPES` locks, not the index's: `on_threads` keeps
them on the logs channel's threads, and readers never wait for an fsync.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from moonrun.errors import StoreUnavailable
from moonrun.logs.memory import MemoryLogStore, _AttemptLog
from moonrun.logs.protocol import LogLine, LogPage
from moonrun.security.files import open_private, private_directory

COMPACT_SLACK = 64 * 1024
"""Bytes an attempt's file may grow beyond twice its last rewritten size before a rewrite."""
STRIPES = 64
"""Locks that attempts' appends share by hash: at most this many wait for the disk at once."""
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class FileLogStore(MemoryLogStore):
    """Bounded log lines, kept in memory and in one append-only file per attempt."""

    on_threads = True

    def __init__(self, root: Path, **limits: int) -> None:
        super().__init__(**limits)
        self._root = root
        self._loaded = False
        self._stripes = [threading.Lock() for _ in range(STRIPES)]
        self._file_bytes: dict[tuple[str, int], int] = {}
        self._compacted: dict[tuple[str, int], int] = {}
        """An attempt file's size when last rewritten: it is rewritten at twice that (and
        `COMPACT_SLACK`), so rewriting costs at most about one write of each byte again."""

    def append(
        self, job_id: str, attempt: int, seq: int, lines: list[LogLine], *, final: bool = False
    ) -> int:
        stored = self._prepare(seq, lines)
        key = (job_id, attempt)
        record: dict[str, Any] = {
            "seq": seq,
            "lines": [[ln.ts, ln.stream, ln.text] for ln, _ in stored],
        }
        if final:
            record["final"] = True
        # An attempt's batches wait for the disk one at a time, holding only its stripe: other
        # attempts' batches and readers (the user channel reads on the event loop) go on.
        with self._stripes[hash(key) % len(self._stripes)]:
            with self._lock:
                self._load()
                log = self._attempt_log(key)
                stored_before = seq in log.batches or seq <= log.floor
                if stored_before and (log.complete or not final):
                    return log.highest
                new = key not in self._file_bytes
            if stored_before:  # the final batch again, its seq stored without saying so
                record = {"final": True}
            # On disk before in memory: a batch whose write fails is not stored at all, and is
            # answered 503 (Run sends it again) rather than as a bug.
            try:
                written = self._write(key, record, new=new, sync=True)
            except OSError as error:
                raise StoreUnavailable(
                    f"cannot write log lines under {self._root}: {error.strerror}"
                ) from None
            with self._lock:
                self._file_bytes[key] = self._file_bytes.get(key, 0) + written
                log = self._attempt_log(key)
                log.complete = log.complete or final
                if not stored_before:
                    self._store(log, seq, stored)
                self._keep_total()
                highest = log.highest
                compact = self._file_bytes[key] > 2 * self._compacted.get(key, 0) + COMPACT_SLACK
                kept = _state(log) if compact else []
            if kept:
                # The batch is on disk already: a rewrite that fails (a full disk) leaves the
                # file as it was, to be rewritten at a later append.
                with contextlib.suppress(OSError):
                    self._rewrite(key, kept)
            return highest

    def read(self, job_id: str, attempt: int, after_seq: int, limit: int = 1000) -> LogPage:
        with self._lock:
            self._load()
        return super().read(job_id, attempt, after_seq, limit)

    def tail(self, job_id: str, attempt: int, count: int, after_seq: int = -1) -> LogPage:
        with self._lock:
            self._load()
        return super().tail(job_id, attempt, count, after_seq)

    def attempts(self, job_id: str) -> list[int]:
        with self._lock:
            self._load()
        return super().attempts(job_id)

    def complete(self, job_id: str, attempt: int) -> bool:
        with self._lock:
            self._load()
        return super().complete(job_id, attempt)

    def delete_job(self, job_id: str, attempts: int) -> None:
        try:
            with self._lock:
                self._load()
            super().delete_job(job_id, attempts)  # each attempt's file goes with it (`_forget`)
            # What is left: files of attempts the index had let go, a rewrite's temporary file.
            shutil.rmtree(self._path((job_id, 1)).parent)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise StoreUnavailable(
                f"cannot delete log lines under {self._root}: {error.strerror}"
            ) from None

    # -- files -----------------------------------------------------------------------------

    def _path(self, key: tuple[str, int]) -> Path:
        job_id, attempt = key
        # Job ids are the store's own; anything else still makes one safe directory name.
        name = job_id if _PLAIN.match(job_id) else "~" + job_id.encode().hex()
        return self._root / name / f"{attempt}.jsonl"

    def _write(self, key: tuple[str, int], record: dict[str, Any], *, new: bool, sync: bool) -> int:
        """Append one record to the attempt's file; returns its size in bytes."""
        path = self._path(key)
        new = new and not path.exists()
        if new:
            private_directory(path.parent)
        data = orjson.dumps(record) + b"\n"
        _append(path, data, sync=sync)
        if new and sync:
            _sync_directory(path.parent)  # the file's name must survive a crash as its bytes do
        return len(data)

    def _rewrite(self, key: tuple[str, int], records: list[dict[str, Any]]) -> None:
        """Replace the attempt's file by `records` (under its stripe, not the lock). A drop
        record another append adds to the old file meanwhile is lost: that only brings back,
        after a restart, lines the store-wide bound will drop again."""
        data = b"".join(orjson.dumps(record) + b"\n" for record in records)
        path = self._path(key)
        temporary = path.with_suffix(".tmp")
        descriptor = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(descriptor, data)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
        _sync_directory(path.parent)
        with self._lock:
            self._file_bytes[key] = self._compacted[key] = len(data)

    def _forget(self, key: tuple[str, int]) -> None:
        self._file_bytes.pop(key, None)
        self._compacted.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def _dropped_for_total(self, key: tuple[str, int], count: int) -> None:
        if self._loaded:
            # Unsynced: losing it in a crash (or to a full disk) only brings back lines the cap
            # would drop again.
            new = key not in self._file_bytes
            try:
                written = self._write(key, {"drop": count}, new=new, sync=False)
            except OSError:
                return
            self._file_bytes[key] = self._file_bytes.get(key, 0) + written

    def _load(self) -> None:
        """Replay every attempt's file, least recently modified first (under the lock)."""
        if self._loaded:
            return
        found: list[tuple[float, tuple[str, int], Path]] = []
        if self._root.is_dir():
            for job_dir in self._root.iterdir():
                job_id = _job_id(job_dir.name)
                if job_id is None or not job_dir.is_dir():
                    continue
                for path in job_dir.glob("*.jsonl"):
                    if path.stem.isdigit():
                        found.append((path.stat().st_mtime, (job_id, int(path.stem)), path))
        for _, key, path in sorted(found, key=lambda item: item[0]):
            self._replay(key, path)
        self._loaded = True
        self._keep_total()

    def _replay(self, key: tuple[str, int], path: Path) -> None:
        data = path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) < len(data):
            # A record cut short by a crash was never acknowledged: cut it off, so that the
            # next record starts on a line of its own.
            with open(path, "r+b") as handle:
                handle.truncate(len(whole))
                os.fsync(handle.fileno())
        log = self._attempt_log(key)
        for raw in whole.splitlines():
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a line the operator mangled: its lines are lost, no others
            log.complete = log.complete or record.get("final") is True
            if "seq" in record:
                seq = record["seq"]
                if seq in log.batches or seq <= log.floor:
                    continue
                lines = [LogLine(seq, ts, stream, text) for ts, stream, text in record["lines"]]
                batch: deque[tuple[LogLine, int]] = deque(
                    (line, len(line.text.encode("utf-8"))) for line in lines
                )
                self._store(log, seq, batch)
            elif "drop" in record:
                for _ in range(min(record["drop"], log.lines)):
                    self._drop_oldest(log)
            elif "floor" in record:
                log.floor, log.highest = record["floor"], record["highest"]
                log.dropped_lines = record["dropped_lines"]
                log.dropped_bytes = record["dropped_bytes"]
        self._file_bytes[key] = len(whole)


def _state(log: _AttemptLog) -> list[dict[str, Any]]:
    """The records a rewritten file holds: the attempt's state, then its kept batches."""
    records: list[dict[str, Any]] = [
        {
            "floor": log.floor,
            "highest": log.highest,
            "dropped_lines": log.dropped_lines,
            "dropped_bytes": log.dropped_bytes,
            "final": log.complete,
        }
    ]
    for seq in log.order:
        batch = log.batches[seq]
        records.append({"seq": seq, "lines": [[ln.ts, ln.stream, ln.text] for ln, _ in batch]})
    return records


def _append(path: Path, data: bytes, *, sync: bool) -> None:
    descriptor = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        size = os.fstat(descriptor).st_size
        try:
            _write_all(descriptor, data)
            if sync:
                os.fsync(descriptor)
        except OSError:
            # Half a record (a full disk) would swallow the next one: take it back if we can.
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, size)
            raise
    finally:
        os.close(descriptor)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _job_id(name: str) -> str | None:
    """The job id a directory name stands for, or None for a name the store did not make."""
    if name.startswith("~"):
        try:
            return bytes.fromhex(name[1:]).decode()
        except ValueError:
            return None
    return name if _PLAIN.match(name) else None


def _sync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
