"""Run's data directory: its identity key, its endpoint, and its files' modes
(docs/protocol.md, "Credentials")."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from moonrun.run import identity
from moonrun.run.journal import Journal

# -- identity -------------------------------------------------------------------------------


def test_join_key_creates_a_private_identity_key(tmp_path: Path) -> None:
    """identity.key is created with mode 0600 and holds the returned key."""
    key = identity.join_key(tmp_path)

    path = tmp_path / identity.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in path.read_bytes()
    assert key.public_key().public_bytes_raw() != b""


def test_a_key_an_unconfirmed_join_left_is_the_key_of_the_next_join(tmp_path: Path) -> None:
    """A join that got no answer keeps its key; the next join presents the same key (the
    platform takes the same token and key again as the same join), never a new one."""
    first = identity.join_key(tmp_path)
    before = (tmp_path / identity.KEY_FILE).read_bytes()

    again = identity.join_key(tmp_path)

    assert again.public_key().public_bytes_raw() == first.public_key().public_bytes_raw()
    assert (tmp_path / identity.KEY_FILE).read_bytes() == before


def test_join_key_refuses_a_data_dir_that_already_joined(tmp_path: Path) -> None:
    """endpoint.json alone (the key lost) is still a joined data dir: no new key over it."""
    identity.save_endpoint(tmp_path, "end_1", "http://127.0.0.1:8470")

    with pytest.raises(identity.DataDirError, match="already holds an identity"):
        identity.join_key(tmp_path)

    assert not (tmp_path / identity.KEY_FILE).exists()


def test_forget_key_undoes_a_refused_join(tmp_path: Path) -> None:
    """After forget_key the next join creates a new key."""
    first = identity.join_key(tmp_path)
    identity.forget_key(tmp_path)

    second = identity.join_key(tmp_path)

    assert second.public_key().public_bytes_raw() != first.public_key().public_bytes_raw()


def test_loading_a_data_dir_that_never_joined_says_to_join(tmp_path: Path) -> None:
    """An empty data dir: DataDirError naming `moonrun run join`."""
    with pytest.raises(identity.DataDirError, match="has not joined a platform") as raised:
        identity.load(tmp_path)

    assert "moonrun run join" in raised.value.message


def test_loading_a_data_dir_with_a_key_but_no_endpoint_says_to_join(tmp_path: Path) -> None:
    """A key without endpoint.json (a join that never finished) is not joined either."""
    identity.join_key(tmp_path)

    with pytest.raises(identity.DataDirError, match="has not joined a platform"):
        identity.load(tmp_path)


def test_loading_a_missing_data_dir_says_it_does_not_exist(tmp_path: Path) -> None:
    """A data dir that is not there: DataDirError naming it, and join_key refuses too."""
    missing = tmp_path / "nowhere"

    with pytest.raises(identity.DataDirError, match="does not exist") as raised:
        identity.load(missing)
    with pytest.raises(identity.DataDirError, match="does not exist"):
        identity.join_key(missing)

    assert str(missing) in raised.value.message


def test_save_endpoint_and_load_round_trip(tmp_path: Path) -> None:
    """load() gives back the endpoint id saved and the key new_key made."""
    key = identity.join_key(tmp_path)
    identity.save_endpoint(tmp_path, "end_42", "http://platform.example:8470")

    held = identity.load(tmp_path)

    assert held.endpoint_id == "end_42"
    assert held.key.public_key().public_bytes_raw() == key.public_key().public_bytes_raw()
    saved = json.loads((tmp_path / identity.ENDPOINT_FILE).read_text())
    assert saved["platform_url"] == "http://platform.example:8470"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        identity.ENDPOINT_FILE,
        identity.KEY_FILE,
    ]


def test_a_damaged_identity_is_a_clear_error(tmp_path: Path) -> None:
    """A key file that is not a PEM key: DataDirError, not a traceback from cryptography."""
    identity.join_key(tmp_path)
    identity.save_endpoint(tmp_path, "end_1", "http://127.0.0.1:8470")
    (tmp_path / identity.KEY_FILE).write_bytes(b"not a key")

    with pytest.raises(identity.DataDirError, match="damaged identity"):
        identity.load(tmp_path)


def test_run_data_dir_and_its_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 022, a joined and started data directory is 0700 and every file in it 0600
    (key, endpoint, lock, journal), so that a command run as another user reads none."""
    data_dir = tmp_path / "run"
    old_umask = os.umask(0o022)
    try:
        data_dir.mkdir()
        identity.join_key(data_dir)
        identity.save_endpoint(data_dir, "end_1", "http://127.0.0.1:8470")
        lock = identity.hold_lock(data_dir)
        Journal(data_dir).rewrite()
    finally:
        os.umask(old_umask)
        lock.close()

    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in data_dir.iterdir()}
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert modes == dict.fromkeys(
        ["identity.key", "endpoint.json", "run.lock", "journal.log"], 0o600
    )


def test_make_private_fixes_the_modes_of_an_existing_data_dir(tmp_path: Path) -> None:
    """A data directory of an older Run (0755, files 0644): `run start` makes it 0700 and its
    files 0600 before anything else."""
    data_dir = tmp_path / "run"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    for name in ("endpoint.json", "journal.json", "run.lock"):
        (data_dir / name).write_text("{}")
        (data_dir / name).chmod(0o644)

    identity.make_private(data_dir)

    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in data_dir.iterdir()}
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert modes == dict.fromkeys(["endpoint.json", "journal.json", "run.lock"], 0o600)
