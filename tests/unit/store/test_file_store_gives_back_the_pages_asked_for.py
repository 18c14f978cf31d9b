"""`FileStore.release_space(pages)` gives back exactly the free pages asked for, no more than
there are: one page at a time down to the last one, then none; asking for no pages (or fewer)
writes nothing at all. The free pages here are those of a table dropped beside the store's."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from moonrun.store.file import FileStore


def free_pages(path: Path) -> int:
    with closing(sqlite3.connect(path)) as connection:
        return int(connection.execute("PRAGMA freelist_count").fetchone()[0])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    """A new FileStore whose file has free pages: a table of 200 rows of 2 KB, dropped."""
    path = tmp_path / "platform.db"
    store = FileStore(path)
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE filler (blob BLOB)")
        connection.executemany("INSERT INTO filler VALUES (?)", [(b"x" * 2000,)] * 200)
        connection.commit()
        connection.execute("DROP TABLE filler")
        connection.commit()
    assert free_pages(path) > 10
    yield store
    store.close()


def test_release_space_gives_back_the_pages_asked_for_and_no_more(store: FileStore) -> None:
    free = free_pages(store.path)
    assert store.release_space(3) == 3
    assert free_pages(store.path) == free - 3
    assert store.release_space(free * 2) == free - 3
    assert (free_pages(store.path), store.release_space(5)) == (0, 0)


def test_release_space_goes_page_by_page_down_to_the_last_free_page(store: FileStore) -> None:
    free = free_pages(store.path)
    given = []
    while (pages := store.release_space(1)) > 0:
        given.append(pages)
    assert (given, free_pages(store.path)) == ([1] * free, 0)


@pytest.mark.parametrize("pages", [0, -1])
def test_release_space_of_no_pages_writes_nothing(store: FileStore, pages: int) -> None:
    free, groups = free_pages(store.path), store.groups_committed
    assert store.release_space(pages) == 0
    assert (free_pages(store.path), store.groups_committed) == (free, groups)
