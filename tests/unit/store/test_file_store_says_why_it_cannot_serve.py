"""A FileStore that cannot serve says why in one line, in process (the CLI tests say the same
through `moonrun store check`, in a subprocess `make mutate` cannot reach): not a database,
locked by another process, not openable for reading and writing, or the SQLite error itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from moonrun.errors import AlreadyExists, StoreUnavailable
from moonrun.store.file import FileStore


def test_a_file_that_is_not_a_database_is_said_to_be_none(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not an SQLite file, not even its header" * 100)
    with pytest.raises(StoreUnavailable) as raised:
        FileStore(path)
    assert raised.value.message == (f"{path} is not an SQLite database (file is not a database)")


def test_a_file_another_process_holds_locked_is_said_to_be_locked(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    FileStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable) as raised:
            FileStore(path, busy_timeout_ms=10)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert raised.value.message == f"{path} is locked by another process (database is locked)"


@pytest.mark.parametrize(
    "detail", ["unable to open database file", "attempt to write a readonly database"]
)
def test_a_file_that_cannot_be_opened_for_writing_is_said_so(tmp_path: Path, detail: str) -> None:
    store = FileStore(tmp_path / "p.db")
    try:
        said = store._unavailable(sqlite3.OperationalError(detail)).message
    finally:
        store.close()
    assert said == f"cannot open {tmp_path / 'p.db'} for reading and writing ({detail})"


def test_any_other_sqlite_error_is_passed_on_naming_the_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "p.db")
    try:
        said = store._unavailable(sqlite3.OperationalError("disk I/O error")).message
    finally:
        store.close()
    assert said == f"store file:{tmp_path / 'p.db'} failed: disk I/O error"


TWICE_THE_SAME_NAME = (
    "CREATE TEMP TABLE t (name TEXT UNIQUE)",
    "INSERT INTO t VALUES ('a')",
    "INSERT INTO t VALUES ('a')",
)


def test_a_taken_name_is_said_to_be_taken(tmp_path: Path) -> None:
    """SQLite's unique-constraint error says which column: a name, not an id."""
    store = FileStore(tmp_path / "p.db")
    try:
        with pytest.raises(AlreadyExists) as raised:
            store._write(lambda cursor: [cursor.execute(sql) for sql in TWICE_THE_SAME_NAME])
    finally:
        store.close()
    assert raised.value.message == "that name is already taken"


def test_a_write_that_fails_in_sqlite_is_unavailable_with_sqlites_words(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "p.db")
    try:
        with pytest.raises(StoreUnavailable) as raised:
            store._write(lambda cursor: cursor.execute("SELECT * FROM no_such_table"))
    finally:
        store.close()
    assert raised.value.message == (
        f"store file:{tmp_path / 'p.db'} failed: no such table: no_such_table"
    )
