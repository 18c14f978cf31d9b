"""Store factories for the parametrized suites: each opens a fresh store and reopens it as a
platform restart would (a new store object over the same file or database)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pymysql

from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.protocol import Store
from moonrun.store.schema import DATA_TABLES

STORE_NAMES = ["memory", "file", "mysql", "postgres"]
"""The stores every contract and scenario suite runs against."""

CONTRACT_STORE_NAMES = ["memory", "file", "mysql+pymysql", "mysql+mysqldb", "postgres"]
"""The store contract runs MySQLStore on each driver; the other suites on the default one
(mysqlclient where it is installed, else PyMySQL)."""

DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class StoreFactory:
    """Opens a fresh store and reopens it over the same data (a platform restart)."""

    name: str
    open: Callable[[], Store]
    reopen: Callable[[Store], Store]
    url: Callable[[], str]
    """The store URL of the most recently opened store (for child processes)."""


def memory_factory() -> StoreFactory:
    # A MemoryStore dies with its process, so a "restart" keeps the same object: the new
    # service instance must still rely on nothing but the store.
    return StoreFactory("memory", MemoryStore, lambda store: store, lambda: "memory://")


def file_factory(make_dir: Callable[[], Path]) -> StoreFactory:
    paths: list[Path] = []

    def open_fresh() -> Store:
        paths.append(make_dir() / "platform.db")
        return FileStore(paths[-1])

    def reopen(store: Store) -> Store:
        store.close()
        assert isinstance(store, FileStore)
        return FileStore(store.path)

    return StoreFactory("file", open_fresh, reopen, lambda: f"file:{paths[-1]}")


def mysql_factory(url: str, driver: str = "mysql") -> StoreFactory:
    url = url.replace("mysql://", f"{driver}://", 1)

    def open_fresh() -> Store:
        wipe_mysql(url)
        return MySQLStore(url)

    def reopen(store: Store) -> Store:
        store.close()
        return MySQLStore(url)

    return StoreFactory(driver, open_fresh, reopen, lambda: url)


def _connect(url: str, database: str | None = None) -> pymysql.Connection:  # type: ignore[type-arg]
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database,
        connect_timeout=3,
        autocommit=True,
    )


def wipe_mysql(url: str) -> None:
    """Empty every moonrun table of the test database (tables may not exist yet)."""
    connection = _connect(url, urlsplit(url).path.lstrip("/"))
    try:
        with connection.cursor() as cursor:
            for table in DATA_TABLES:
                with contextlib.suppress(pymysql.err.ProgrammingError):
                    cursor.execute(f"DELETE FROM {table.name}")
    finally:
        connection.close()


def mysql_test_database() -> Iterator[str]:
    """A fresh `moonrun_test_<random>` database for one test session, dropped at its end.

    Yields nothing (so the caller skips) when MariaDB is unreachable.
    """
    base = os.environ.get("MOONRUN_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
    name = f"moonrun_test_{secrets.token_hex(4)}"
    admin = _connect(base)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        parts = urlsplit(base)
        yield f"{parts.scheme}://{parts.netloc}/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


def postgres_factory(url: str) -> StoreFactory:
    from moonrun.store.postgres import PostgresStore

    def open_fresh() -> Store:
        wipe_postgres(url)
        return PostgresStore(url)

    def reopen(store: Store) -> Store:
        store.close()
        return PostgresStore(url)

    return StoreFactory("postgres", open_fresh, reopen, lambda: url)


def wipe_postgres(url: str) -> None:
    """Empty every moonrun table of the test database (tables may not exist yet)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        present = {
            row[0]
            for row in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        names = [table.name for table in DATA_TABLES if table.name in present]
        if names:
            connection.execute(f"TRUNCATE {', '.join(names)}")


def postgres_test_database() -> Iterator[str]:
    """A fresh `moonrun_test_<random>` database for one test session, dropped at its end."""
    import psycopg

    base = os.environ.get("MOONRUN_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    name = f"moonrun_test_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        # A commit answers before PostgreSQL flushes its WAL: only a crash of PostgreSQL itself
        # could lose one, which no test makes (they kill platforms, never the database). The
        # tests then wait on what moonrun does, not on this machine's disk.
        admin.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
    parts = urlsplit(base)
    try:
        yield f"{parts.scheme}://{parts.netloc}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
