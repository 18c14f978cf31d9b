"""Files and directories only their owner may use: explicit modes, whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_directory(path: Path) -> None:
    """Create `path` and every missing parent 0700; directories that exist are left as they are
    (an operator's own /var/lib or home directory is theirs to set)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue  # another thread or replica made it first: it set the mode the same way
        # mkdir's mode passes through the umask; a umask such as 0277 would take our own bits.
        os.chmod(directory, PRIVATE_DIR)


def open_private(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_CREAT)` with mode 0600, also for a file left by an earlier
    process with a wider mode."""
    descriptor = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        os.fchmod(descriptor, PRIVATE_FILE)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def make_private(path: Path) -> None:
    """Take group's and others' bits off an existing file (no-op for a missing one)."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return
    if mode & 0o077:
        os.chmod(path, mode & PRIVATE_DIR)
