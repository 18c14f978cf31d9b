"""`moonrun store backup`: a serving platform's FileStore, logs, artifacts and secret, copied.

The database is copied first, in one read transaction (`moonrun.store.backup`), then the log
and artifact files: every log batch and artifact chunk a platform acknowledged before the
backup began was on disk before the database's copy began, so the copy holds the logs and
artifacts of every job it holds. Files written after that may come along too (a log file of a
job the copy does not hold is never read: its lines are only reachable through the job). A log
file caught mid-append ends in a cut record, which the log store drops on replay, as after a
crash; temporary files of unfinished writes are left out. The secret comes last: the copy is
a data directory that `moonrun platform serve --store file:PATH/platform.db` serves as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from moonrun.errors import StoreUnavailable
from moonrun.security.files import open_private, private_directory
from moonrun.store.backup import copy_database
from moonrun.wiring.settings import PlatformConfig

DATABASE_NAME = "platform.db"
CHUNK = 1 << 20


@dataclass(frozen=True)
class BackupReport:
    """What a backup copied."""

    target: Path
    database_bytes: int
    log_files: int
    artifact_files: int
    secret: bool


def backup(config: PlatformConfig, target: Path) -> BackupReport:
    """Copy the platform's file store and data directory into `target` (new or empty)."""
    source = config.store_path
    if source is None:
        raise StoreUnavailable(
            "moonrun store backup copies a file: store; for MySQL use mariadb-dump "
            "--single-transaction (docs/operations.md, Backups)"
        )
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise StoreUnavailable(f"cannot back up to {target}: it exists and is not an empty folder")
    try:
        private_directory(target)
    except OSError as error:
        raise StoreUnavailable(f"cannot create {target}: {error.strerror}") from None
    database = target / DATABASE_NAME
    copy_database(source, database)
    logs = _copy_tree(config.logs_dir, target / "logs")
    artifacts = _copy_tree(config.artifacts_dir, target / "artifacts")
    secret = _copy_file(config.secret_path, target / "platform.secret")
    return BackupReport(target, database.stat().st_size, logs, artifacts, secret)


def _copy_tree(source: Path, target: Path) -> int:
    """Copy every finished file under `source`; temporary files (`*.tmp`, `.*`) stay behind."""
    copied = 0
    if not source.is_dir():
        return copied
    for directory, _, names in os.walk(source):
        relative = Path(directory).relative_to(source)
        for name in names:
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            if _copy_file(Path(directory) / name, target / relative / name):
                copied += 1
    return copied


def _copy_file(source: Path, target: Path) -> bool:
    """Copy one file 0600 and sync it; False when it vanished meanwhile (renamed over)."""
    try:
        reader = open(source, "rb")  # noqa: SIM115 - closed below, once its copy is synced
    except FileNotFoundError:
        return False
    try:
        private_directory(target.parent)
        with reader, os.fdopen(open_private(target, os.O_WRONLY | os.O_TRUNC), "wb") as writer:
            while block := reader.read(CHUNK):
                writer.write(block)
            writer.flush()
            os.fsync(writer.fileno())
    except OSError as error:
        raise StoreUnavailable(f"cannot copy {source} to {target}: {error.strerror}") from None
    return True
