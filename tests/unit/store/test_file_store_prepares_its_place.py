"""A FileStore makes its directory private when it is missing, and says in one line why it
cannot open a path: a directory where the file should be, a parent that is a file, a
directory that cannot be made, a companion file that cannot be made."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.store.file import FileStore


def test_a_store_in_a_missing_directory_makes_it_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "moonrun" / "platform.db"
    FileStore(path).close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_directory_where_the_file_should_be_is_said_to_be_one(tmp_path: Path) -> None:
    (tmp_path / "platform.db").mkdir()
    with pytest.raises(StoreUnavailable, match="it is a directory, not a file"):
        FileStore(tmp_path / "platform.db")


def test_a_parent_that_is_a_file_is_said_not_to_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    with pytest.raises(StoreUnavailable, match=r"state is not a directory"):
        FileStore(tmp_path / "state" / "platform.db")


def test_a_directory_that_cannot_be_made_is_said_so_with_the_systems_words(
    tmp_path: Path,
) -> None:
    (tmp_path / "state").write_text("")
    with pytest.raises(StoreUnavailable, match=r"cannot create .*state/moonrun: Not a directory"):
        FileStore(tmp_path / "state" / "moonrun" / "platform.db")


def test_a_file_that_cannot_be_made_is_said_so_with_the_systems_words(tmp_path: Path) -> None:
    (tmp_path / "platform.db").symlink_to(tmp_path / "gone" / "platform.db")
    with pytest.raises(
        StoreUnavailable, match=r"for reading and writing \(No such file or directory\)"
    ):
        FileStore(tmp_path / "platform.db")
