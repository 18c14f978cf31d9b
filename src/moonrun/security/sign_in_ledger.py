"""Where the console's failed sign-ins are counted: in memory (one platform process), or in
files of a directory every platform process shares (several behind a load balancer count
together: docs/operations.md, "Several platforms").

A ledger holds, per key (`name:<name>` or `addr:<address>`), how many failures and when the
latest was; `update` reads some keys and writes what its `change` makes of them in one step
that no other thread or process comes between, so that tries arriving at once on several
processes cannot pass the allowance together.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from moonrun.security.files import open_private, private_directory

Failures = tuple[int, int]
"""How many failures, and the latest's instant (ms)."""
Change = Callable[[dict[str, Failures]], dict[str, Failures | None]]
"""From the keys' failures (a key with none is absent), what to write: None forgets a key;
a key left out is left as it is."""

PRUNE_AT = 10_000
"""Keys a ledger in memory holds before forgotten ones are dropped (each failure with a new
name adds one)."""
PRUNE_EVERY = 1000
"""Updates of a ledger on files between two sweeps of the keys nobody failed for long."""


class Ledger(Protocol):
    def update(self, keys: Sequence[str], change: Change) -> None:
        """Read `keys`, and write what `change` makes of them, atomically."""
        ...

    def prune_due(self) -> bool:
        """Whether keys nobody failed for long should be forgotten now."""
        ...

    def prune(self, before: int) -> None:
        """Forget every key whose latest failure is older than `before`."""
        ...


class MemoryLedger:
    """Failures in this process's memory: a restart forgets, and other processes count apart."""

    def __init__(self) -> None:
        self._failures: dict[str, Failures] = {}
        self._lock = threading.Lock()

    def update(self, keys: Sequence[str], change: Change) -> None:
        with self._lock:
            changed = change({key: self._failures[key] for key in keys if key in self._failures})
            for key, failures in changed.items():
                if failures is None:
                    self._failures.pop(key, None)
                else:
                    self._failures[key] = failures

    def prune_due(self) -> bool:
        return len(self._failures) > PRUNE_AT

    def prune(self, before: int) -> None:
        with self._lock:
            self._failures = {k: v for k, v in self._failures.items() if v[1] >= before}


class FileLedger:
    """Failures in files under `root`, one a key (named by its SHA-256: no name or address on
    disk), each changed holding its `flock`, so every process sharing `root` counts together.
    Keys are locked in one order, so two updates never wait for each other's."""

    def __init__(self, root: Path, *, prune_every: int = PRUNE_EVERY) -> None:
        self._root = root
        self._prune_every = prune_every
        self._updates = 0

    def update(self, keys: Sequence[str], change: Change) -> None:
        private_directory(self._root)
        with contextlib.ExitStack() as held:
            locked = {
                key: held.enter_context(self._locked(key)) for key in sorted(set(keys), key=_name)
            }
            current = {}
            for key, descriptor in locked.items():
                failures = _read(descriptor)
                if failures is not None:
                    current[key] = failures
            for key, failures in change(current).items():
                descriptor = locked[key]
                os.ftruncate(descriptor, 0)
                if failures is not None:
                    os.pwrite(descriptor, f"{failures[0]} {failures[1]}\n".encode(), 0)
        self._updates += 1

    def prune_due(self) -> bool:
        return self._updates % self._prune_every == 0

    def prune(self, before: int) -> None:
        """Delete the files of keys nobody failed since `before` (an empty file is a key
        forgotten already). A key a try is counting meanwhile keeps its file: it is locked."""
        if not self._root.is_dir():
            return
        for path in self._root.iterdir():
            with contextlib.suppress(OSError):
                descriptor = os.open(path, os.O_RDWR)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    failures = _read(descriptor)
                    if failures is None or failures[1] < before:
                        path.unlink()
                finally:
                    os.close(descriptor)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[int]:
        path = self._root / _name(key)
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
            os.close(descriptor)  # pruned while we waited: lock the file at the path now
        try:
            yield descriptor
        finally:
            os.close(descriptor)


def _name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _read(descriptor: int) -> Failures | None:
    fields = os.pread(descriptor, 64, 0).split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields):
        return None
    return int(fields[0]), int(fields[1])
