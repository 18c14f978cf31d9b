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

Several platform processes may share the directory (`shared`, which the wiring sets beside a
MySQL or PostgreSQL store; docs/operations.md, "Several platforms"): nothing an attempt's
answers depend on is this process's own. An append holds the attempt
file's lock (`flock`), reads what the file holds beyond what this process replayed (another
process's batches), judges its batch against that, appends it and replays it from the file as
every other process will; a read first replays what the file gained (or the whole file, after
another process rewrote it: a new inode at the path). The attempt caps are thus the same
everywhere. The store-wide bound is each process's over the attempts it knows, the directory
listed again every `RESCAN_S` for the attempts the others made; its drops are noted in an
attempt's file only where the noting process has replayed all of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from moonrun.errors import StoreUnavailable
from moonrun.logs.memory import LINE_RECORD_BYTES, MemoryLogStore, _AttemptLog
from moonrun.logs.protocol import LogLine, LogPage
from moonrun.security.files import open_private, private_directory

COMPACT_SLACK = 64 * 1024
"""Bytes an attempt's file may grow beyond twice its last rewritten size before a rewrite."""
STRIPES = 64
"""Locks that attempts' appends share by hash: at most this many wait for the disk at once."""
HEAD_BYTES = 256
"""The first bytes of an attempt's file that tell it from a rewrite of it."""
RESCAN_S = 10.0
"""How often a shared directory is listed again for attempt files other platform processes
made, so that the store-wide bound counts them too."""
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class FileLogStore(MemoryLogStore):
    """Bounded log lines, kept in memory and in one append-only file per attempt, in a directory
    several platform processes may share."""

    on_threads = True

    def __init__(
        self, root: Path, *, shared: bool = False, rescan_s: float = RESCAN_S, **limits: int
    ) -> None:
        super().__init__(**limits)
        self._root = root
        self._loaded = False
        self._shared = shared
        """Other processes may write the directory: reads first read what files gained, and the
        directory is listed again every `rescan_s`. (Appends read what their file gained either
        way: it costs them nothing beside their fsync.)"""
        self._rescan_s = rescan_s if shared else math.inf
        self._scanned_at = 0.0
        self._stripes = [threading.Lock() for _ in range(STRIPES)]
        self._file_bytes: dict[tuple[str, int], int] = {}
        """How far each attempt's file has been replayed into memory (whole records)."""
        self._files: dict[tuple[str, int], tuple[int, bytes]] = {}
        """The file replayed: its inode and first bytes. Another inode at the path, or other
        first bytes (a rewrite's inode number may be one freed by an earlier rewrite), is a
        rewrite, replayed from its start."""
        self._seen: dict[tuple[str, int], tuple[int, int, int]] = {}
        """The inode, size and modification time last seen: a file that still shows them has
        nothing new."""
        self._compacted: dict[tuple[str, int], int] = {}
        """An attempt file's size when last rewritten: it is rewritten at twice that (and
        `COMPACT_SLACK`), so rewriting costs at most about one write of each byte again."""
        self._drops: list[tuple[tuple[str, int], int]] = []
        """Lines the store-wide bound dropped, not yet noted in their attempts' files."""

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
        self._rescan()
        # An attempt's batches wait for the disk one at a time, holding its stripe (threads)
        # and its file's lock (processes): other attempts' batches and readers go on.
        with self._stripes[hash(key) % len(self._stripes)]:
            try:
                with self._locked(key) as descriptor:
                    return self._append_locked(key, descriptor, seq, record, final)
            except OSError as error:
                # On disk before in memory: a batch whose write fails is not stored at all, and
                # is answered 503 (Run sends it again) rather than as a bug.
                raise StoreUnavailable(
                    f"cannot write log lines under {self._root}: {error.strerror}"
                ) from None

    def _append_locked(
        self, key: tuple[str, int], descriptor: int, seq: int, record: dict[str, Any], final: bool
    ) -> int:
        """`append` holding the attempt file's lock: what the file holds (whoever wrote it) is
        read first, so the batch is judged against every process's batches."""
        with self._lock:
            self._load()
            self._sync(key, descriptor)
            log = self._attempt_log(key)
            stored_before = seq in log.batches or seq <= log.floor
            if stored_before and (log.complete or not final):
                return log.highest
        if stored_before:  # the final batch again, its seq stored without saying so
            record = {"final": True}
        data = orjson.dumps(record) + b"\n"
        _append(descriptor, data, sync=True, directory=self._path(key).parent)
        with self._lock:
            # The batch goes into memory as every other process reads it: from the file.
            self._sync(key, descriptor)
            log = self._attempt_log(key)
            self._keep_total()
            highest = log.highest
            compact = self._file_bytes[key] > 2 * self._compacted.get(key, 0) + COMPACT_SLACK
            kept = _state(log) if compact else []
            drops, self._drops = self._drops, []
        rewritten = False
        if kept:
            # The batch is on disk already: a rewrite that fails (a full disk) leaves the
            # file as it was, to be rewritten at a later append.
            with contextlib.suppress(OSError):
                self._rewrite(key, kept)
                rewritten = True
        self._note_drops(drops, key, None if rewritten else descriptor)
        return highest

    def read(self, job_id: str, attempt: int, after_seq: int, limit: int = 1000) -> LogPage:
        self._refresh((job_id, attempt))
        return super().read(job_id, attempt, after_seq, limit)

    def tail(self, job_id: str, attempt: int, count: int, after_seq: int = -1) -> LogPage:
        self._refresh((job_id, attempt))
        return super().tail(job_id, attempt, count, after_seq)

    def attempts(self, job_id: str) -> list[int]:
        directory = self._path((job_id, 1)).parent
        shared = self._shared and directory.is_dir()
        for path in directory.glob("*.jsonl") if shared else ():
            if path.stem.isdigit():  # another process may have made it
                self._refresh((job_id, int(path.stem)))
        self._refresh((job_id, 1))
        return super().attempts(job_id)

    def complete(self, job_id: str, attempt: int) -> bool:
        self._refresh((job_id, attempt))
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

    @contextlib.contextmanager
    def _locked(self, key: tuple[str, int]) -> Iterator[int]:
        """The attempt's file (made if missing), open and locked (`flock`) against every other
        writer, thread or process; the lock is on the file at the path, never on one a rewrite
        replaced meanwhile."""
        path = self._path(key)
        if not path.parent.is_dir():
            private_directory(path.parent)
        while True:
            descriptor = open_private(path, os.O_RDWR)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                        break
            except BaseException:
                os.close(descriptor)
                raise
            os.close(descriptor)  # rewritten (or deleted) while we waited: lock the new one
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def _refresh(self, key: tuple[str, int]) -> None:
        """Bring the attempt up to its file before a read (another process may have written)."""
        with self._lock:
            self._load()
            if self._shared:
                self._sync(key)
            drops, self._drops = self._drops, []
        if drops:  # the directory was (listed again and) found past the store-wide bound
            self._note_drops(drops, None, None)

    def _sync(self, key: tuple[str, int], locked: int | None = None) -> None:
        """Replay what the attempt's file holds beyond what was replayed (under the lock): all
        of it after a rewrite, nothing once it is gone. `locked`: the file's descriptor, its
        lock held, so that a record cut short can only be a crash's and is cut off."""
        descriptor = locked
        if descriptor is None:
            try:
                descriptor = os.open(self._path(key), os.O_RDONLY)
            except FileNotFoundError:
                if key in self._file_bytes:  # deleted by another process
                    self._let_go(key)
                return
            except OSError:
                return  # the directory is away (a network file system): answer what is held
        try:
            status = os.fstat(descriptor)
            seen = (status.st_ino, status.st_size, status.st_mtime_ns)
            offset = self._file_bytes.get(key)
            if self._seen.get(key) == seen and (locked is None or offset == status.st_size):
                return  # nothing new (and, for a writer, no record cut short to cut off)
            head = os.pread(descriptor, HEAD_BYTES, 0)
            if offset is not None and not self._same_file(key, status, head, offset):
                self._let_go(key)  # rewritten by another process: replay it from its start
                self._compacted[key] = status.st_size
                offset = None
            offset = offset or 0
            if status.st_size > offset:
                data = os.pread(descriptor, status.st_size - offset, offset)
                whole = data[: data.rfind(b"\n") + 1]
                if locked is not None and len(whole) < len(data):
                    # A record cut short by a crash was never acknowledged: cut it off, so that
                    # the next record starts on a line of its own.
                    os.ftruncate(descriptor, offset + len(whole))
                    os.fsync(descriptor)
                self._replay(key, whole)
                offset += len(whole)
            self._file_bytes[key] = offset
            self._files[key] = (status.st_ino, head)
            self._seen[key] = seen
        finally:
            if locked is None:
                os.close(descriptor)

    def _same_file(
        self, key: tuple[str, int], status: os.stat_result, head: bytes, offset: int
    ) -> bool:
        """Whether the file at the path is the one replayed (grown or not), not a rewrite."""
        known_inode, known_head = self._files.get(key, (-1, b""))
        shared = min(len(head), len(known_head))
        return (
            status.st_ino == known_inode
            and head[:shared] == known_head[:shared]
            and status.st_size >= offset
        )

    def _let_go(self, key: tuple[str, int]) -> None:
        """Forget the attempt in memory only (its file is gone or was rewritten elsewhere)."""
        log = self._logs.pop(key, None)
        if log is not None:
            self._bytes -= log.bytes + log.lines * LINE_RECORD_BYTES
        self._file_bytes.pop(key, None)
        self._files.pop(key, None)
        self._seen.pop(key, None)
        self._compacted.pop(key, None)

    def _rewrite(self, key: tuple[str, int], records: list[dict[str, Any]]) -> None:
        """Replace the attempt's file by `records` (holding its file's lock, not the index's):
        the other processes see another inode at the path and replay it from its start."""
        data = b"".join(orjson.dumps(record) + b"\n" for record in records)
        path = self._path(key)
        temporary = path.with_suffix(".tmp")
        descriptor = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(descriptor, data)
            os.fsync(descriptor)
            inode = os.fstat(descriptor).st_ino
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
        _sync_directory(path.parent)
        with self._lock:
            self._file_bytes[key] = self._compacted[key] = len(data)
            self._files[key] = (inode, data[:HEAD_BYTES])
            self._seen.pop(key, None)

    def _forget(self, key: tuple[str, int]) -> None:
        self._file_bytes.pop(key, None)
        self._files.pop(key, None)
        self._seen.pop(key, None)
        self._compacted.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def _dropped_for_total(self, key: tuple[str, int], count: int) -> None:
        if self._loaded:
            self._drops.append((key, count))

    def _note_drops(
        self,
        drops: list[tuple[tuple[str, int], int]],
        held: tuple[str, int] | None,
        locked: int | None,
    ) -> None:
        """Note in each attempt's file what the store-wide bound dropped, where this process has
        replayed all of it and can lock it at once (else the note is left out).

        Unsynced: losing a note in a crash (or to a full disk, or a busy lock) only brings back
        lines the cap will drop again. A note says "drop the N oldest lines" at the end of
        what this process replayed, so every process replaying it drops the same lines."""
        for key, count in drops:
            if key == held:
                if locked is not None:
                    self._note_drop(key, locked, count)
                continue
            try:
                descriptor = os.open(self._path(key), os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._note_drop(key, descriptor, count)
            except OSError:
                continue
            finally:
                os.close(descriptor)

    def _note_drop(self, key: tuple[str, int], descriptor: int, count: int) -> None:
        with self._lock:
            status = os.fstat(descriptor)
            if self._seen.get(key) != (status.st_ino, status.st_size, status.st_mtime_ns):
                return  # written or rewritten since this process replayed it
            with contextlib.suppress(OSError):
                self._file_bytes[key] += _append(
                    descriptor, orjson.dumps({"drop": count}) + b"\n", sync=False
                )
                status = os.fstat(descriptor)
                self._seen[key] = (status.st_ino, status.st_size, status.st_mtime_ns)

    def _load(self) -> None:
        """Replay every attempt's file, least recently modified first (under the lock), at the
        first call."""
        if self._loaded:
            return
        self._scanned_at = time.monotonic()
        for key in self._listing():
            self._sync(key)
        self._loaded = True
        self._keep_total()

    def _rescan(self) -> None:
        """Every `rescan_s` (not under the lock, which readers wait for): bring in the attempt
        files other processes made, and let go of those they deleted, so that the store-wide
        bound counts what the directory holds. Each attempt a read or an append touches is
        brought up to its file then, whatever the time."""
        now = time.monotonic()
        if not self._loaded or now - self._scanned_at < self._rescan_s:
            return
        self._scanned_at = now
        listed = self._listing()
        present = set(listed)
        with self._lock:
            for key in [key for key in self._file_bytes if key not in present]:
                if not self._path(key).exists():  # not one this process made since the listing
                    self._let_go(key)
            for key in listed:
                if key not in self._file_bytes:
                    self._sync(key)
            self._keep_total()
            drops, self._drops = self._drops, []
        if drops:
            self._note_drops(drops, None, None)

    def _listing(self) -> list[tuple[str, int]]:
        """Every attempt file's key, least recently modified first."""
        found: list[tuple[float, tuple[str, int]]] = []
        if self._root.is_dir():
            for job_dir in self._root.iterdir():
                job_id = _job_id(job_dir.name)
                if job_id is None or not job_dir.is_dir():
                    continue
                for path in job_dir.glob("*.jsonl"):
                    if path.stem.isdigit():
                        with contextlib.suppress(FileNotFoundError):
                            found.append((path.stat().st_mtime, (job_id, int(path.stem))))
        return [key for _, key in sorted(found, key=lambda item: item[0])]

    def _replay(self, key: tuple[str, int], whole: bytes) -> None:
        """Apply whole records of the attempt's file, in order (under the lock)."""
        if not whole:
            return
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


def _append(descriptor: int, data: bytes, *, sync: bool, directory: Path | None = None) -> int:
    """Write `data` at the end of a locked file; returns its size. Synced, the file's first
    record also syncs `directory`: the file's name must survive a crash as its bytes do."""
    size = os.fstat(descriptor).st_size
    try:
        _write_all(descriptor, data, size)
        if sync:
            os.fsync(descriptor)
    except OSError:
        # Half a record (a full disk) would swallow the next one: take it back if we can.
        with contextlib.suppress(OSError):
            os.ftruncate(descriptor, size)
        raise
    if sync and size == 0 and directory is not None:
        _sync_directory(directory)
    return len(data)


def _write_all(descriptor: int, data: bytes, offset: int = 0) -> None:
    """Write all of `data` at `offset` (not at the descriptor's position: a file shared by
    processes is appended to at the end its lock holder sees)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view, offset = view[written:], offset + written


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
