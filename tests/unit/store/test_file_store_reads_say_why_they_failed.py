"""A FileStore read that SQLite refuses is a StoreUnavailable naming SQLite's reason, whether
it runs on a reader connection or inside a group the loop flusher is applying."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.store.file import FileStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    opened = FileStore(tmp_path / "platform.db")
    yield opened
    opened.close()


def drop_jobs(store: FileStore) -> None:
    """Take the jobs table away behind the store's back: every read of a job now fails."""
    with sqlite3.connect(store.path) as connection:
        connection.execute("DROP TABLE jobs")


def test_a_failed_read_says_sqlites_reason(store: FileStore) -> None:
    drop_jobs(store)
    with pytest.raises(StoreUnavailable, match="no such table: jobs"):
        store.get_job("job_x")


def test_a_failed_read_inside_a_loop_group_says_sqlites_reason(store: FileStore) -> None:
    drop_jobs(store)

    async def main() -> object:
        return await store.run_in_group(store.get_job, "job_x")

    with pytest.raises(StoreUnavailable, match="no such table: jobs"):
        asyncio.run(main())
