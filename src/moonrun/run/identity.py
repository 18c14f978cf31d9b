"""Run's data directory (0700): its Ed25519 identity key and the endpoint it joined as (0600,
like every file in it), whatever the umask."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.errors import DataDirError

KEY_FILE = "identity.key"
ENDPOINT_FILE = "endpoint.json"
LOCK_FILE = "run.lock"


@dataclass(frozen=True)
class Identity:
    endpoint_id: str
    key: Ed25519PrivateKey


def hold_lock(data_dir: Path) -> IO[str]:
    """Take the data directory for this process: two Runs on one journal would corrupt it.
    The lock goes with the returned file (and with the process, however it ends)."""
    check_data_dir(data_dir)
    descriptor = os.open(data_dir / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    handle = os.fdopen(descriptor, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DataDirError(f"another Run is already using {data_dir}") from None
    return handle


def check_data_dir(data_dir: Path) -> None:
    if not data_dir.is_dir():
        raise DataDirError(f"data directory {data_dir} does not exist; create it first")


def make_private(data_dir: Path) -> None:
    """Mode 0700 for the data directory and 0600 for every file in it, so that no other user
    (a command run as another user included) reads the key or the journal."""
    check_data_dir(data_dir)
    os.chmod(data_dir, 0o700)
    for path in data_dir.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)


def join_key(data_dir: Path) -> Ed25519PrivateKey:
    """The key to join with: the one an unconfirmed join left (the platform takes the same
    token with the same key again as the same join), or a new one, mode 0600. Refused once
    the data directory has joined."""
    make_private(data_dir)
    path = data_dir / KEY_FILE
    if (data_dir / ENDPOINT_FILE).exists():
        raise DataDirError(f"{data_dir} already holds an identity; Run joins only once")
    if path.exists():
        return _read_key(path, data_dir)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())
    return key


def forget_key(data_dir: Path) -> None:
    """Undo `join_key` when the join it was for was refused (or never reached the platform)."""
    (data_dir / KEY_FILE).unlink(missing_ok=True)


def save_endpoint(data_dir: Path, endpoint_id: str, platform_url: str) -> None:
    path = data_dir / ENDPOINT_FILE
    temporary = path.with_suffix(".tmp")
    document = json.dumps({"endpoint_id": endpoint_id, "platform_url": platform_url})
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(document)
    os.replace(temporary, path)


def load(data_dir: Path) -> Identity:
    check_data_dir(data_dir)
    key_path, endpoint_path = data_dir / KEY_FILE, data_dir / ENDPOINT_FILE
    if not key_path.exists() or not endpoint_path.exists():
        raise DataDirError(f"{data_dir} has not joined a platform; run `moonrun run join` first")
    key = _read_key(key_path, data_dir)
    try:
        endpoint_id = json.loads(endpoint_path.read_text())["endpoint_id"]
    except (ValueError, KeyError, TypeError) as error:
        raise DataDirError(f"{data_dir} holds a damaged identity: {error}") from None
    if not isinstance(endpoint_id, str):
        raise DataDirError(f"{data_dir} holds a damaged identity")
    return Identity(endpoint_id, key)


def _read_key(path: Path, data_dir: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise DataDirError(f"{data_dir} holds a damaged identity: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DataDirError(f"{data_dir} holds a damaged identity")
    return key
