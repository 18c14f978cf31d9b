"""MySQLStore: MySQL 8.0+ or MariaDB 10.6+ (mysqlclient or PyMySQL), for several platforms.

Writes run at READ COMMITTED, one transaction per unit on a pooled connection. Claims lock
their candidates with `SELECT ... FOR UPDATE SKIP LOCKED`, so two platform processes claiming
at once take different jobs and never grant one attempt twice; every other job write is a
compare-and-swap on `version`. Deadlocks (1213), lock wait timeouts (1205) and "record has
changed" (1020) run the unit again, a bounded number of times. InnoDB itself shares one log
flush among the transactions that commit at the same moment.

Connections stay open between requests. A write connection idle for more than a second is
pinged before use (a write is not repeated blindly: it might have been applied); a read that
finds its connection dead is simply repeated once on a fresh one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from moonrun.backoff import Backoff
from moonrun.errors import StoreUnavailable
from moonrun.store.mysql_wakeups import POLL_READ_TIMEOUT_S, RECONNECT, MySQLWakeups, Row
from moonrun.store.queries import COUNT_SHARDS, Queries
from moonrun.store.sql import Cursor, SqlStore, duplicate

T = TypeVar("T")

RETRYABLE_CODES = frozenset({1213, 1205, 1020})
CONFLICT_BACKOFF = Backoff(initial_s=0.01, max_s=0.2)
"""Pauses before a write that lost a deadlock or a lock wait is tried again."""
CONNECTION_CODES = frozenset({2002, 2003, 2005, 2006, 2013, 2014, 2055})
SCHEMA_LOCK = "moonrun_schema"
PING_AFTER_IDLE_S = 1.0


class _Pool:
    """Open connections of one kind (reads or writes), reused most-recent first."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._idle: list[tuple[Any, float]] = []
        self._lock = threading.Lock()

    def take(self) -> tuple[Any, float]:
        """A connection and how long it sat idle (infinite for a new one)."""
        with self._lock:
            if self._idle:
                connection, since = self._idle.pop()
                return connection, time.monotonic() - since
        return self._connect(), float("inf")

    def give(self, connection: Any) -> None:
        with self._lock:
            self._idle.append((connection, time.monotonic()))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection, _ in idle:
            with contextlib.suppress(Exception):  # a dead connection has nothing to report
                connection.close()


class MySQLStore(SqlStore):
    """A store in one MySQL/MariaDB database, shared by any number of platform processes."""

    count_shards = COUNT_SHARDS
    write_retries = 8

    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        self.url = _driver_url(url)
        self._driver, self._flags = _driver(self.url.drivername)
        super().__init__(Queries("mysql"), redact(url))
        self._connect_timeout_s = connect_timeout_s
        self._reads = _Pool(lambda: self._open(autocommit=True))
        self._writes = _Pool(lambda: self._open(autocommit=False))
        self._unit = threading.local()
        self._migrate(
            create_engine(
                self.url,
                poolclass=NullPool,
                isolation_level="READ COMMITTED",
                connect_args={"connect_timeout": connect_timeout_s, "charset": "utf8mb4"},
            )
        )

    def _open(self, *, autocommit: bool, read_timeout_s: int | None = None) -> Any:
        driver = self._driver
        # Only the wake-ups' poller bounds its reads: a connection cut without a word must not
        # hold it (and the waiters' wake-ups) until TCP gives up.
        bounds = {} if read_timeout_s is None else {"read_timeout": read_timeout_s}
        try:
            return driver.connect(
                host=self.url.host or "127.0.0.1",
                port=self.url.port or 3306,
                user=self.url.username or "",
                password=self.url.password or "",
                database=self.url.database,
                charset="utf8mb4",
                connect_timeout=self._connect_timeout_s,
                autocommit=autocommit,
                client_flag=self._flags,
                init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                **bounds,
            )
        except driver.MySQLError as error:
            raise self._unavailable(error) from None

    def _read(self, work: Callable[[Cursor], T]) -> T:
        for attempt in (1, 2):
            connection, _ = self._reads.take()
            try:
                with connection.cursor() as cursor:
                    result = work(cursor)
            except self._driver.MySQLError as error:
                connection.close()
                if attempt == 1 and _mysql_code(error) in CONNECTION_CODES:
                    continue  # a dead pooled connection: a read is safe to repeat
                raise self._unavailable(error) from None
            except BaseException:
                connection.close()
                raise
            self._reads.give(connection)
            return result
        raise AssertionError("unreachable")

    def _write(self, work: Callable[[Cursor], T]) -> T:
        driver = self._driver
        delays = CONFLICT_BACKOFF.delays()
        for attempt in range(1, self.write_retries + 1):
            connection = self._fresh_write_connection()
            self._unit.counts = []
            try:
                with connection.cursor() as cursor:
                    result = work(cursor)
                    self._commit(cursor, self._unit.counts)
            except driver.IntegrityError as error:
                self._abandon(connection)
                raise duplicate(error) from None
            except driver.MySQLError as error:
                self._abandon(connection)
                if attempt < self.write_retries and _mysql_code(error) in RETRYABLE_CODES:
                    # Soon: the other transaction usually finishes quickly.
                    time.sleep(next(delays))
                    continue
                raise self._unavailable(error) from None
            except BaseException:
                self._abandon(connection)
                raise
            self._writes.give(connection)
            return result
        raise AssertionError("unreachable")

    def _apply_counts(self, cursor: Cursor, changes: list[dict[str, Any]]) -> None:
        self._unit.counts.extend(changes)

    def _commit(self, cursor: Any, counts: list[dict[str, Any]]) -> None:
        """COMMIT, with the unit's count changes in the same round trip."""
        if not counts:
            cursor.execute("COMMIT")
            return
        rows = ", ".join(["(%s, %s, %s)"] * len(counts))
        values = [
            value
            for change in counts
            for value in (change["state"], change["shard"], change["delta"])
        ]
        cursor.execute(
            f"INSERT INTO job_counts (state, shard, n) VALUES {rows} "
            "ON DUPLICATE KEY UPDATE n = n + VALUES(n); COMMIT",
            values,
        )
        while cursor.nextset():
            pass

    def _fresh_write_connection(self) -> Any:
        """A pooled write connection, checked with a ping if it sat idle for a while."""
        connection, idle_s = self._writes.take()
        if idle_s <= PING_AFTER_IDLE_S:
            return connection
        try:
            connection.ping()
            return connection
        except self._driver.MySQLError:
            connection.close()
            return self._open(autocommit=False)

    def _abandon(self, connection: Any) -> None:
        """Roll back and return the connection to the pool, or close it if it is broken."""
        try:
            connection.rollback()
        except self._driver.MySQLError:
            connection.close()
            return
        self._writes.give(connection)

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        code = _mysql_code(error)
        where = f"{self.url.host}:{self.url.port or 3306}"
        if code in (1044, 1045, 1698):
            return StoreUnavailable(
                f"MySQL at {where} refused user {self.url.username!r}: wrong user or password"
            )
        if code == 1049:
            return StoreUnavailable(
                f"MySQL at {where} has no database {self.url.database!r}; create it first"
            )
        if code in CONNECTION_CODES:
            return StoreUnavailable(f"cannot reach MySQL at {where}: is the server running?")
        args = getattr(error, "args", ())
        detail = args[-1] if args else error
        return StoreUnavailable(f"store {self.description} failed: {detail}")

    def _lock_schema(self, connection: Connection) -> None:
        # DDL commits implicitly in MySQL, so a named lock serialises concurrent migrations.
        connection.execute(text("SELECT GET_LOCK(:name, 60)"), {"name": SCHEMA_LOCK})
        connection.commit()

    def _unlock_schema(self, connection: Connection) -> None:
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": SCHEMA_LOCK})
        connection.commit()

    def wakeups(
        self,
        heard: Callable[[str, str | None], None],
        missed: Callable[[], None],
        *,
        reconnect: Backoff = RECONNECT,
    ) -> MySQLWakeups:
        """Wake-ups across the platform processes on this database (`store/mysql_wakeups.py`):
        announcements are inserted on this store's pool, and one connection of their own polls
        (started by `start()`)."""
        return MySQLWakeups(
            lambda: self._open(autocommit=True, read_timeout_s=POLL_READ_TIMEOUT_S),
            self._announce,
            heard,
            missed,
            reconnect=reconnect,
        )

    def _announce(self, statement: str, rows: list[Row]) -> None:
        # On an autocommit connection: one INSERT, committed alone (a repeat after a dead
        # connection only announces the changes twice).
        self._read(lambda cursor: cursor.executemany(statement, rows))

    def close(self) -> None:
        self._reads.close()
        self._writes.close()


DRIVERS = {"mysql+mysqldb": "MySQLdb", "mysql+pymysql": "pymysql"}
"""The DB-API drivers a MySQL store can use: mysqlclient (C; it parses wide rows about three
times as fast: docs/benchmarks.md) and PyMySQL (pure Python, nothing to compile)."""


def _driver_url(url: str) -> URL:
    """The URL with its driver: the one named (`mysql+pymysql://`, `mysql+mysqldb://`), else
    mysqlclient where it is installed, else PyMySQL."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreUnavailable(f"not a MySQL URL: {redact(url)}") from None
    if parsed.drivername not in ("mysql", *DRIVERS) or not parsed.database:
        raise StoreUnavailable(
            f"not a MySQL URL: {redact(url)}; use mysql://USER:PASS@HOST:PORT/DATABASE"
        )
    if parsed.drivername == "mysql":
        found = importlib.util.find_spec("MySQLdb") is not None
        return parsed.set(drivername="mysql+mysqldb" if found else "mysql+pymysql")
    return parsed


def _driver(name: str) -> tuple[Any, int]:
    """The driver module, and the client flags every connection needs: rowcount counts rows
    matched, not only rows changed (compare-and-swap needs it), and several statements per
    round trip let the count changes ride with COMMIT."""
    module = DRIVERS[name]
    if importlib.util.find_spec(module) is None:
        raise StoreUnavailable(
            "MySQL stores need PyMySQL (pip install 'moonrun[mysql]') or mysqlclient "
            "(pip install 'moonrun[mysql-c]')"
        )
    driver = importlib.import_module(module)
    constants = importlib.import_module(f"{module}.constants.CLIENT")
    return driver, constants.FOUND_ROWS | constants.MULTI_STATEMENTS


def redact(url: str) -> str:
    """The URL with any password replaced by `***`."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return "mysql://<unparseable URL>"


def _mysql_code(error: BaseException) -> int | None:
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None
