"""FileStore: one SQLite file (stdlib sqlite3), WAL, synchronous=FULL, writes serialised.

With `synchronous=FULL` in WAL mode a transaction is on disk when its commit returns, so an
acknowledged write survives a crash or power loss. Every write transaction starts with
`BEGIN IMMEDIATE`, taking the single write lock up front: two writers never deadlock on a
lock upgrade, and a compare-and-swap reads and writes under the same lock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from moonrun.errors import StoreUnavailable
from moonrun.store.sql import SqlStore

DEFAULT_PATH = Path(".moonrun") / "platform.db"
DEFAULT_BUSY_TIMEOUT_MS = 5000


class FileStore(SqlStore):
    """The embedded default store: everything in one SQLite file."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS):
        self.path = Path(path)
        # SQLite has one writer; threads of this process queue here instead of in SQLite's
        # busy handler, which sleeps in steps of milliseconds. Other processes still wait in it.
        self._write_lock = threading.Lock()
        _prepare_directory(self.path)
        engine = create_engine(f"sqlite+pysqlite:///{self.path}")

        @event.listens_for(engine, "connect")
        def configure(dbapi_connection: sqlite3.Connection, _: Any) -> None:
            # We issue BEGIN ourselves (below), so the driver must not.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def begin(connection: Connection) -> None:
            writes = connection.get_execution_options().get("moonrun_write", False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

        super().__init__(engine, f"file:{self.path}")

    def _unavailable(self, error: SQLAlchemyError) -> StoreUnavailable:
        detail = str(error.orig if isinstance(error, DBAPIError) else error)
        if "file is not a database" in detail:
            return StoreUnavailable(f"{self.path} is not an SQLite database ({detail})")
        if "locked" in detail:
            return StoreUnavailable(f"{self.path} is locked by another process ({detail})")
        if "unable to open" in detail or "readonly" in detail:
            return StoreUnavailable(f"cannot open {self.path} for reading and writing ({detail})")
        return StoreUnavailable(f"store file:{self.path} failed: {detail}")


def _prepare_directory(path: Path) -> None:
    """Create the store's directory, private to its owner, if it is missing."""
    if path.is_dir():
        raise StoreUnavailable(f"cannot open {path}: it is a directory, not a file")
    directory = path.parent
    if directory.exists():
        if not directory.is_dir():
            raise StoreUnavailable(f"cannot open {path}: {directory} is not a directory")
        return
    try:
        directory.mkdir(mode=0o700, parents=True)
        os.chmod(directory, 0o700)
    except OSError as error:
        raise StoreUnavailable(f"cannot create {directory}: {error.strerror}") from None
