"""The store seam: the only place scheduling state lives (memory, SQLite file, MySQL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from moonrun.errors import StoreUnavailable

if TYPE_CHECKING:  # `moonrun run start` imports this module for its default; not the domain
    from moonrun.store.protocol import Store

__all__ = ["DEFAULT_STORE_URL", "open_store"]

DEFAULT_STORE_URL = "file:.moonrun/platform.db"


def open_store(url: str) -> Store:
    """Open the store a URL names: `memory://`, `file:PATH`, `mysql://USER:PASS@HOST:PORT/DB`
    or `postgresql://USER:PASS@HOST:PORT/DB`.

    Durable stores are opened, checked and migrated here, so a bad URL, an unreadable file or
    an unreachable database fails at start with a `StoreUnavailable` that names no password.
    """
    if url in ("memory://", "memory:"):
        from moonrun.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith("file:"):
        from moonrun.store.file import FileStore

        path, _, query = url.removeprefix("file:").removeprefix("//").partition("?")
        if not path:
            raise StoreUnavailable("file: needs a path, e.g. file:.moonrun/platform.db")
        return FileStore(path, **_file_options(query))
    if url.startswith(("mysql:", "mysql+pymysql:", "mysql+mysqldb:")):
        from moonrun.store.mysql import MySQLStore

        return MySQLStore(url)
    if url.startswith(("postgresql:", "postgres:")):
        from moonrun.store.postgres import PostgresStore

        return PostgresStore(url)
    scheme = url.split(":", 1)[0] if ":" in url else url[:16]
    raise StoreUnavailable(
        f"unknown store {scheme!r}: use memory://, file:PATH, mysql://USER:PASS@HOST:PORT/DB "
        "or postgresql://USER:PASS@HOST:PORT/DB"
    )


def _file_options(query: str) -> dict[str, int]:
    """`busy_timeout_ms=N` is the one option a file store URL takes."""
    options: dict[str, int] = {}
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        if name != "busy_timeout_ms" or not value.isdigit():
            raise StoreUnavailable(f"unknown file store option {pair!r}; known: busy_timeout_ms=N")
        options[name] = int(value)
    return options
