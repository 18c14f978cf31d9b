"""FileStore: one SQLite file (stdlib sqlite3), WAL, synchronous=FULL, writes group-committed.

With `synchronous=FULL` in WAL mode a transaction is on disk when its commit returns, so an
acknowledged write survives a crash or power loss. All writes of this process go through one
connection and `GroupCommit`: the units waiting at a moment share one `BEGIN IMMEDIATE` ...
`COMMIT` and its fsync, each in its own savepoint. Taking the write lock up front means two
writers (of two processes) never deadlock on a lock upgrade, and a compare-and-swap reads and
writes under the same lock. Reads use a small pool of connections that live as long as the
store, so no connection is opened (and its pragmas run) per request.

The threads of one process take turns at the store (`_gate`, held by each read and by the
units of a group, not by the commit's fsync): CPython's sqlite3 lets go of the GIL around
every step and every column it reads, and with several threads inside the store at once each
of those is a chance for a thread switch (tens of µs each on a small VM). Taking turns made
eight threads' claim -> ack -> result 17% faster here and one thread no slower
(docs/benchmarks.md). Reads are short and served by indexes; a read now waits for the units
being applied, never for an fsync or for another process's write lock.

Work on the event loop goes through `run_in_group` (the loop's flusher, `loop_flush.py`):
the calls that arrive while a group commits are applied together in the next one, each
write in its own savepoint, under one COMMIT and fsync taken off the loop, and answered
after it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.pool import NullPool

from moonrun.errors import StoreUnavailable
from moonrun.security.files import make_private, open_private, private_directory
from moonrun.store.group_commit import GroupCommit
from moonrun.store.loop_flush import LoopFlusher
from moonrun.store.queries import Queries
from moonrun.store.sql import Cursor, SqlStore, duplicate

T = TypeVar("T")

DEFAULT_PATH = Path(".moonrun") / "platform.db"
DEFAULT_BUSY_TIMEOUT_MS = 5000
INCREMENTAL = 2
"""`PRAGMA auto_vacuum`'s answer for incremental vacuum."""


class FileStore(SqlStore):
    """The embedded default store: everything in one SQLite file."""

    counted_by_triggers = True

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS):
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._readers: list[sqlite3.Connection] = []
        self._closed = False
        self._gate = threading.RLock()
        super().__init__(Queries("sqlite"), f"file:{self.path}")
        _prepare_directory(self.path)
        _prepare_files(self.path)
        self._migrate(self._migration_engine())
        connection = self._open()
        # Each unit's savepoint keeps a statement journal (the jobs table has triggers); in a
        # temporary file that was an open, an unlink and writes on the loop per job changed
        # (8-11% of the platform's CPU a job). It only undoes a unit within its transaction
        # (a crash is recovered from the WAL), and is small. The readers keep the default:
        # a large sort of theirs may spill to a file.
        connection.execute("PRAGMA temp_store = MEMORY")  # pragma: no mutate
        self._writes = GroupCommit(connection, self._translate, gate=self._gate)
        self._flusher = LoopFlusher(self._writes, connection, self._gate, self._translate)

    async def run_in_group(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(*args)` (store calls, on the event loop) in the flusher's next group;
        its result or error once the group is committed."""
        return await self._flusher.run(work, *args)

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once what this thread wrote is committed: at once, or after the
        COMMIT of the group this thread is applying."""
        applying = self._flusher.applying()
        if applying is None:
            action()
        else:
            applying.after.append(action)

    def _open(self) -> sqlite3.Connection:
        """A connection in autocommit mode (we BEGIN ourselves), WAL, fully synced."""
        try:
            connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, cached_statements=512
            )
            connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            # `no mutate` on a line whose only literal is SQL: mutation testing would change
            # its case, which SQLite ignores (docs/testing.md).
            # Before anything writes the file's header (WAL does): a new file keeps a map of
            # its pages, so pruned space goes back to the file system bit by bit
            # (`release_space`). An older file keeps its mode until `moonrun store compact`.
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")  # pragma: no mutate
            connection.execute("PRAGMA journal_mode = WAL")  # pragma: no mutate
            connection.execute("PRAGMA synchronous = FULL")  # pragma: no mutate
        except sqlite3.Error as error:
            raise self._unavailable(error) from None
        return connection

    def _migration_engine(self) -> Any:
        engine = create_engine("sqlite+pysqlite://", creator=self._open, poolclass=NullPool)

        @event.listens_for(engine, "begin")
        def begin(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    def _read(self, work: Callable[[Cursor], T]) -> T:
        applying = self._flusher.applying()
        if applying is not None:  # sees what the group wrote so far
            try:
                return work(applying.cursor)
            except sqlite3.Error as error:
                raise self._unavailable(error) from None
        try:
            connection = self._readers.pop()
        except IndexError:
            connection = self._open()
        cursor = connection.cursor()
        try:
            with self._gate:
                return work(cursor)
        except sqlite3.Error as error:
            raise self._unavailable(error) from None
        finally:
            cursor.close()
            if self._closed:
                connection.close()
            else:
                self._readers.append(connection)

    def _write(self, work: Callable[[Cursor], T]) -> T:
        applying = self._flusher.applying()
        if applying is not None:
            return applying.write(work)
        return self._writes.run(work)

    def _translate(self, error: BaseException) -> BaseException:
        if isinstance(error, sqlite3.IntegrityError):
            return duplicate(error)
        if isinstance(error, sqlite3.Error):
            return self._unavailable(error)
        return error

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        detail = str(error)
        if "file is not a database" in detail:
            return StoreUnavailable(f"{self.path} is not an SQLite database ({detail})")
        if "locked" in detail:
            return StoreUnavailable(f"{self.path} is locked by another process ({detail})")
        if "unable to open" in detail or "readonly" in detail:
            return StoreUnavailable(f"cannot open {self.path} for reading and writing ({detail})")
        return StoreUnavailable(f"store file:{self.path} failed: {detail}")

    def release_space(self, pages: int) -> int:
        """Move up to `pages` free pages to the file's end and cut them off (incremental
        vacuum, in one short write; the file shrinks at the next checkpoint). A file made
        before incremental vacuum keeps its space until `moonrun store compact`."""

        def work(cursor: Cursor) -> int:
            cursor.execute("PRAGMA auto_vacuum")  # pragma: no mutate
            mode = cursor.fetchall()
            cursor.execute("PRAGMA freelist_count")  # pragma: no mutate
            free = int(cursor.fetchall()[0][0])
            if not mode or int(mode[0][0]) != INCREMENTAL or free == 0:
                return 0
            count = min(pages, free)
            # Python's sqlite3 steps a statement without columns once, and each step of this
            # pragma frees one page: so one execute per page (microseconds each).
            for _ in range(count):
                cursor.execute(f"PRAGMA incremental_vacuum({count})")
            # Finish the last pragma before the savepoint ends.
            cursor.execute("SELECT 1")  # pragma: no mutate
            cursor.fetchall()
            return count

        return self._write(work) if pages > 0 else 0

    @property
    def groups_committed(self) -> int:
        """Write transactions so far (each may hold many units); for tests and benches."""
        return self._writes.groups

    @property
    def units_committed(self) -> int:
        """Units of work those transactions held."""
        return self._writes.units

    @property
    def flusher(self) -> LoopFlusher:
        """The event loop's flusher (its `groups` and `calls`, for tests and benches)."""
        return self._flusher

    def close(self) -> None:
        self._closed = True
        readers, self._readers = self._readers, []
        for connection in readers:
            connection.close()
        writes = getattr(self, "_writes", None)
        if writes is not None:
            self._flusher.close()
            writes.close()


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
        private_directory(directory)
    except OSError as error:
        raise StoreUnavailable(f"cannot create {directory}: {error.strerror}") from None


def _prepare_files(path: Path) -> None:
    """Create the store file 0600 before SQLite opens it: SQLite gives the -wal and -shm files
    the mode of the database file, and would create it under the umask (0644 under 022)."""
    try:
        os.close(open_private(path, os.O_RDWR))
        for companion in ("-wal", "-shm", "-journal"):
            make_private(path.with_name(path.name + companion))
    except OSError as error:
        raise StoreUnavailable(
            f"cannot open {path} for reading and writing ({error.strerror})"
        ) from None
