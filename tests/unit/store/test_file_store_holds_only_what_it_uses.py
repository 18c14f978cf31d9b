"""A FileStore holds one connection to its file between calls, closes what it stops using,
begins its transactions itself, and makes every file beside the database private.

The descriptor counts read `/proc/self/fd`: a connection SQLAlchemy's pool kept after the
migrations, or a reader handed back to a closed store, is a descriptor to the database file
that stays open for the life of the process.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from moonrun.store.file import FileStore


def descriptors_of(path: Path) -> int:
    """How many of this process's open descriptors point at `path`."""
    target, count = str(path.resolve()), 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone already
            count += os.readlink(f"/proc/self/fd/{name}") == target
    return count


def test_an_opened_store_holds_one_connection_its_migrations_left_none(tmp_path: Path) -> None:
    path = tmp_path / "platform.db"
    store = FileStore(path)
    try:
        opened = descriptors_of(path)
    finally:
        store.close()
    assert (opened, descriptors_of(path)) == (1, 0)


def test_a_read_that_ends_after_close_closes_its_connection(tmp_path: Path) -> None:
    """A request still reading while the platform stops must not leave its connection open."""
    path = tmp_path / "platform.db"
    store = FileStore(path)
    store.close()
    users = store.list_users()
    assert (users, descriptors_of(path)) == ([], 0)


def test_leftover_files_beside_the_database_are_made_private_at_open(tmp_path: Path) -> None:
    """A killed platform (or an older version, or a restore) may leave -wal, -shm and -journal
    files readable by others; SQLite keeps an existing file's mode, so the store takes the
    group's and others' bits off before it opens them."""
    path = tmp_path / "platform.db"
    FileStore(path).close()
    companions = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
    for companion in companions:
        companion.touch()
        companion.chmod(0o644)
    store = FileStore(path)
    try:
        modes = {c.name: oct(stat.S_IMODE(c.stat().st_mode)) for c in companions if c.exists()}
    finally:
        store.close()
    assert modes == {c.name: "0o600" for c in companions}


def test_connections_never_begin_a_transaction_on_their_own(tmp_path: Path) -> None:
    """Autocommit (`isolation_level=None`): the store's own BEGIN IMMEDIATE starts every
    write; Python's implicit BEGIN before a write outside it would hold a transaction that
    nothing commits."""
    store = FileStore(tmp_path / "platform.db")
    try:
        writing = store._write(lambda cursor: cursor.connection.isolation_level)
        reading = store._read(lambda cursor: cursor.connection.isolation_level)
    finally:
        store.close()
    assert (writing, reading) == (None, None)


def test_the_description_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "platform.db"
    store = FileStore(path)
    store.close()
    assert store.description == f"file:{path}"
