"""The FileStore connection that writes is the one whose pragmas make an answer durable.

A freshly opened connection proves only how `_open` sets a connection up; the writes go
through the group commit's own connection, and a killed process cannot show a missing fsync
(the OS keeps its cache), so the pragmas are read on the connection every write uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moonrun.store.file import DEFAULT_BUSY_TIMEOUT_MS, FileStore


def pragma_of_writes(store: FileStore, name: str) -> Any:
    """`PRAGMA name` as the connection that commits the store's writes answers it."""
    return store._write(lambda cursor: cursor.execute(f"PRAGMA {name}").fetchone()[0])


def test_the_connection_that_writes_syncs_fully_in_wal_mode(tmp_path: Path) -> None:
    """synchronous=FULL (2): each commit is fsynced before its answer; WAL; the busy timeout."""
    store = FileStore(tmp_path / "p.db")
    try:
        pragmas = [pragma_of_writes(store, name) for name in ("synchronous", "journal_mode")]
        busy_timeout = pragma_of_writes(store, "busy_timeout")
    finally:
        store.close()
    assert (pragmas, busy_timeout) == ([2, "wal"], DEFAULT_BUSY_TIMEOUT_MS)


def test_the_connections_that_read_wait_for_a_lock_as_long_as_the_writer(tmp_path: Path) -> None:
    """A read waits out another process's checkpoint for the busy timeout, not an instant."""
    store = FileStore(tmp_path / "p.db", busy_timeout_ms=1234)
    try:
        read = store._read(lambda cursor: cursor.execute("PRAGMA busy_timeout").fetchone()[0])
        written = pragma_of_writes(store, "busy_timeout")
    finally:
        store.close()
    assert (read, written) == (1234, 1234)
