"""`moonrun store compact`: a FileStore's free space given back at once, with `VACUUM`.

It also switches a file made before incremental vacuum to it (`auto_vacuum` changes only with
a `VACUUM`), after which the sweeper gives pruned space back on its own. `VACUUM` rewrites the
whole file holding the write lock: a platform's writes wait meanwhile (up to their busy
timeout), so run it while the platform is stopped or quiet (docs/operations.md, "Retention").
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from moonrun.errors import StoreUnavailable

BUSY_TIMEOUT_MS = 60_000
"""How long the compaction waits for a platform's write to finish before it takes the lock."""


@dataclass(frozen=True)
class Compacted:
    """The file's size (database and its write-ahead log) before and after."""

    before_bytes: int
    after_bytes: int


def compact_database(path: Path) -> Compacted:
    """Rewrite the SQLite database at `path` without its free pages, in incremental vacuum."""
    if not path.is_file():
        raise StoreUnavailable(f"cannot compact {path}: no such file")
    before = _size(path)
    try:
        connection = sqlite3.connect(path, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            connection.execute("VACUUM")
            # The rewritten pages sit in the write-ahead log until a checkpoint copies them
            # back; TRUNCATE also empties the log, so the space is free on disk now.
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            connection.close()
    except sqlite3.Error as error:
        raise StoreUnavailable(f"cannot compact {path}: {error}") from None
    return Compacted(before, _size(path))


def _size(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
