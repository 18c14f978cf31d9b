"""What a `command` job can reach: the user it runs as, its environment, its working directory.

Run's own secrets (the identity key, the journal with every held attempt's lease and payload,
Run's environment) must stay out of a command's reach: commands get an allow-listed
environment, a working directory of their own per attempt, and with `--run-as` another uid.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from moonrun.errors import InvalidRequest

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
PASSED_ON = ("PATH", "LANG", "TZ", "TMPDIR")
"""Run's environment variables a command gets (with every `LC_*`); nothing else of it."""


@dataclass(frozen=True)
class CommandUser:
    """The user commands run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> CommandUser:
        """The user `name` (or a numeric uid) with its primary and supplementary groups."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, OverflowError):
            raise InvalidRequest(f"--run-as: there is no user {name!r} on this host") from None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    @classmethod
    def effective(cls) -> CommandUser:
        """The user Run itself runs as."""
        uid = os.geteuid()
        try:
            return cls.named(str(uid))
        except InvalidRequest:  # a uid without a passwd entry (some containers)
            return cls(str(uid), uid, os.getegid(), tuple(os.getgroups()), "/")


def child_environment(inherited: Mapping[str, str], user: CommandUser) -> dict[str, str]:
    """The environment of every command: the allow-listed part of `inherited`, and the
    command user's HOME, USER and LOGNAME; never Run's tokens or `MOONRUN_*` settings."""
    environment = {
        name: value
        for name, value in inherited.items()
        if name in PASSED_ON or name.startswith("LC_")
    }
    environment.setdefault("PATH", DEFAULT_PATH)
    environment.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    return environment


def command_user_warning(user: CommandUser, euid: int) -> str | None:
    """What Run warns about at start when commands run as root or as Run's own user."""
    advice = "start Run with --run-as USER, an unprivileged user other than Run's own"
    if user.uid == 0:
        return (
            "commands run as root: a command job can read and change everything on this host, "
            f"Run's identity key and journal included; {advice}"
        )
    if user.uid == euid:
        return (
            "commands run as Run's own user: a command job can read Run's identity key and "
            f"journal; {advice}"
        )
    return None


@dataclass(frozen=True)
class Confinement:
    """How `command` starts its processes: as whom, with which environment, where."""

    run_as: CommandUser | None = None
    """None: as Run's own user (no uid change)."""
    environment: Mapping[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    work_root: Path | None = None
    """Where per-attempt working directories are made; None: the system's temporary directory."""

    def spawn_options(self) -> dict[str, Any]:
        """Keyword arguments of `asyncio.create_subprocess_exec` for the user and environment."""
        options: dict[str, Any] = {"env": dict(self.environment)}
        if self.run_as is not None:
            options.update(
                user=self.run_as.uid, group=self.run_as.gid, extra_groups=list(self.run_as.groups)
            )
        return options

    def make_workdir(self, job_id: str, attempt: int) -> Path:
        """A new empty directory (0700) for one attempt, owned by the command user."""
        path = Path(tempfile.mkdtemp(prefix=f"moonrun-{job_id}-{attempt}-", dir=self.work_root))
        if self.run_as is not None:
            os.chown(path, self.run_as.uid, self.run_as.gid)
        return path

    def open_artifact(self, workdir: Path, path: str) -> BinaryIO | str:
        """The artifact at `path` (relative paths are in `workdir`) opened for reading, or why
        it may not be uploaded (blocking).

        Opened, not named: the uploader reads it after the working directory is gone, and what
        was checked is what is read. Never through a symbolic link, never anything but a
        regular file, and with `--run-as` only one the command user owns: Run reads with its
        own rights, which may be more.
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO never blocks
        try:
            fd = os.open(workdir / path, flags)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return "a symbolic link"
            return error.strerror or "cannot be opened"
        found = os.fstat(fd)
        why = None
        if not stat.S_ISREG(found.st_mode):
            why = "not a regular file"
        elif self.run_as is not None and found.st_uid != self.run_as.uid:
            why = "not owned by the command user"
        if why is not None:
            os.close(fd)
            return why
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")


def remove_workdir(path: Path) -> None:
    """Remove an attempt's working directory and whatever the command left in it."""
    shutil.rmtree(path, ignore_errors=True)
