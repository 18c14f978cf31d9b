"""MySQLStore: MySQL 8.0+ or MariaDB 10.6+ through PyMySQL, for scale and several platforms.

Transactions run at READ COMMITTED. Claims lock their candidates with
`SELECT ... FOR UPDATE SKIP LOCKED`, so two platform processes claiming at once take
different jobs and never grant one attempt twice; every other write is a compare-and-swap on
`version`. Deadlocks (1213), lock wait timeouts (1205) and "record has changed" (1020) run the
transaction again, a bounded number of times.
"""

from __future__ import annotations

import importlib.util

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from moonrun.errors import StoreUnavailable
from moonrun.store.sql import SqlStore

RETRYABLE_CODES = frozenset({1213, 1205, 1020})
SCHEMA_LOCK = "moonrun_schema"


class MySQLStore(SqlStore):
    """A store in one MySQL/MariaDB database, shared by any number of platform processes."""

    skip_locked = True
    write_retries = 8

    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        if importlib.util.find_spec("pymysql") is None:
            raise StoreUnavailable("MySQL stores need PyMySQL: pip install 'moonrun[mysql]'")
        self.url = _driver_url(url)
        connect_args = {"connect_timeout": connect_timeout_s, "charset": "utf8mb4"}
        # Writes check their connection first (a retried write could apply twice); reads skip
        # the ping and the reset round trips, and are simply repeated on a dead connection.
        writes = create_engine(
            self.url,
            isolation_level="READ COMMITTED",
            pool_pre_ping=True,
            pool_recycle=3600,
            connect_args=connect_args,
        )
        reads = create_engine(
            self.url,
            isolation_level="AUTOCOMMIT",
            pool_reset_on_return=None,
            pool_recycle=3600,
            connect_args=connect_args,
        )
        super().__init__(writes, redact(url), read_engine=reads)

    def _is_retryable(self, error: DBAPIError) -> bool:
        return _mysql_code(error) in RETRYABLE_CODES

    def _unavailable(self, error: SQLAlchemyError) -> StoreUnavailable:
        code = _mysql_code(error) if isinstance(error, DBAPIError) else None
        where = f"{self.url.host}:{self.url.port or 3306}"
        if code in (1044, 1045, 1698):
            return StoreUnavailable(
                f"MySQL at {where} refused user {self.url.username!r}: wrong user or password"
            )
        if code == 1049:
            return StoreUnavailable(
                f"MySQL at {where} has no database {self.url.database!r}; create it first"
            )
        if code in (2003, 2005, 2006, 2013):
            return StoreUnavailable(f"cannot reach MySQL at {where}: is the server running?")
        detail = error.orig.args[-1] if isinstance(error, DBAPIError) and error.orig else error
        return StoreUnavailable(f"store {self.description} failed: {detail}")

    def _lock_schema(self, connection: Connection) -> None:
        # DDL commits implicitly in MySQL, so a named lock serialises concurrent migrations.
        connection.execute(text("SELECT GET_LOCK(:name, 60)"), {"name": SCHEMA_LOCK})
        connection.commit()

    def _unlock_schema(self, connection: Connection) -> None:
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": SCHEMA_LOCK})
        connection.commit()


def _driver_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreUnavailable(f"not a MySQL URL: {redact(url)}") from None
    if parsed.drivername not in ("mysql", "mysql+pymysql") or not parsed.database:
        raise StoreUnavailable(
            f"not a MySQL URL: {redact(url)}; use mysql://USER:PASS@HOST:PORT/DATABASE"
        )
    return parsed.set(drivername="mysql+pymysql")


def redact(url: str) -> str:
    """The URL with any password replaced by `***`."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "mysql://<unparseable URL>"


def _mysql_code(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None
