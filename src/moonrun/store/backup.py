"""An online copy of a FileStore's database, taken while platforms write to it.

`VACUUM INTO` reads the database in one read transaction, so the copy holds exactly the
transactions committed before that transaction began: every write a platform had answered by
then, none half-applied. In WAL mode a reader never blocks a writer, so serving goes on (the
platform's commits wait for nothing; the copy's reads compete for the disk only). The copy is
compact (free pages left out), written under a temporary name, fsync'd, then renamed, so a
crash mid-backup leaves no file that looks whole.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from moonrun.errors import StoreUnavailable
from moonrun.security.files import open_private

BUSY_TIMEOUT_MS = 5000
"""How long the copy's read waits for a checkpoint that holds the WAL's lock (rare, short)."""


def copy_database(source: Path, target: Path) -> None:
    """Copy the SQLite database `source` to `target` (which must not exist), 0600, synced."""
    if not source.is_file():
        raise StoreUnavailable(f"cannot back up {source}: no such file")
    if target.exists():
        raise StoreUnavailable(f"cannot back up to {target}: it exists")
    partial = target.with_name(target.name + ".partial")
    # VACUUM INTO takes an empty file as well as a missing one: making it first gives it our
    # mode (0600) rather than the umask's, since it holds every user's password hash.
    partial.unlink(missing_ok=True)
    os.close(open_private(partial, os.O_WRONLY))
    try:
        connection = sqlite3.connect(f"file:{source}?mode=ro", uri=True, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            connection.execute("VACUUM INTO ?", (str(partial),))
        finally:
            connection.close()
        _sync(partial)
        os.replace(partial, target)
        _sync(target.parent)
    except sqlite3.Error as error:
        partial.unlink(missing_ok=True)
        raise StoreUnavailable(f"cannot back up {source}: {error}") from None
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise StoreUnavailable(f"cannot write {target}: {error.strerror}") from None


def _sync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
