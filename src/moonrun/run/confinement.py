"""What a `command` job can reach: the user it runs as, its environment, its working directory.

Run's own secrets (the identity key, the journal with every held attempt's lease and payload,
Run's environment) must stay out of a command's reach: commands get an allow-listed
environment, a working directory of their own per attempt under Run's work root, and with
`--run-as` another uid; with `--run-as-range` each owner a uid of its own, and where the host
allows it a private /tmp and PID view per attempt. Every process of an attempt belongs to it
(run/supervisor.py): in a cgroup of its own when Run may make one (run/cgroups.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from moonrun.errors import InvalidRequest
from moonrun.run.cgroups import Cgroups
from moonrun.run.owners import OwnerIds
from moonrun.run.resolve import open_without_links

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
    def of_owner(cls, uid: int) -> CommandUser:
        """An owner's user of `--run-as-range`: uid, and a group of the same number, that no
        passwd or group entry names; its home is the attempt's working directory."""
        return cls(f"moonrun-{uid}", uid, uid, (uid,), "")

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
    cgroups: Cgroups | None = None
    """Where attempt cgroups are made; None: the supervisor's subreaper alone."""
    owner_ids: OwnerIds | None = None
    """`--run-as-range`: each owner's uid; None: every command runs as `run_as`."""
    namespaces: bool = False
    """Whether each attempt gets a PID and mount namespace (a private /tmp and PID view)."""

    def user_for(self, owner_id: str | None) -> CommandUser | None:
        """Whom an owner's command runs as (blocking: may map the owner a uid, saved):
        with `--run-as-range` the owner's own user (a job that names no owner runs as the
        `--run-as` user when there is one), else the `--run-as` user; None for Run's own.
        `OwnerRangeFull` when the range has no uid left for a new owner."""
        if self.owner_ids is None or (owner_id is None and self.run_as is not None):
            return self.run_as
        return CommandUser.of_owner(self.owner_ids.uid_for(owner_id))

    def environment_for(self, user: CommandUser | None, workdir: Path) -> dict[str, str]:
        """The command's environment: an owner's user has no home but its working directory."""
        environment = dict(self.environment)
        if user is not None and not user.home:
            environment.update(HOME=str(workdir), USER=user.name, LOGNAME=user.name)
        return environment

    def make_workdir(self, job_id: str, attempt: int, user: CommandUser | None = None) -> Path:
        """A new empty directory (0700) for one attempt, owned by the command user."""
        user = user if user is not None else self.run_as
        path = Path(tempfile.mkdtemp(prefix=f"moonrun-{job_id}-{attempt}-", dir=self.work_root))
        if user is not None:
            os.chown(path, user.uid, user.gid)
        return path

    def open_artifact(
        self, workdir: Path, path: str, user: CommandUser | None = None
    ) -> BinaryIO | str:
        """The artifact at `path` (relative paths are in `workdir`) opened for reading, or why
        it may not be uploaded (blocking).

        Opened, not named: the uploader reads it after the working directory is gone, and what
        was checked is what is read. Never through a symbolic link, at any point of its path
        (run/resolve.py), never anything but a regular file, and with another command user
        only one that user owns: Run reads with its own rights, which may be more.
        """
        user = user if user is not None else self.run_as
        flags = os.O_RDONLY | os.O_NONBLOCK  # a FIFO never blocks
        try:
            fd = open_without_links(workdir, path, flags)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return "a symbolic link"
            if error.errno == errno.EXDEV:
                return "a path with a '..' component"
            return error.strerror or "cannot be opened"
        found = os.fstat(fd)
        why = None
        if not stat.S_ISREG(found.st_mode):
            why = "not a regular file"
        elif user is not None and found.st_uid != user.uid:
            why = "not owned by the command user"
        if why is not None:
            os.close(fd)
            return why
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")


def make_work_root(path: Path) -> None:
    """Run's root of attempts' working directories: made if missing, 0711 (others may pass
    through to their own directory, never list it), owned by Run's user, not a link."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o711)
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise InvalidRequest(
            f"--work-dir {path} must be a directory of Run's own user (not a link)"
        )
    os.chmod(path, 0o711)


def default_work_root(data_dir: Path) -> Path:
    """Beside the data directory (which commands must not reach): `<data dir>-work`."""
    resolved = data_dir.resolve()
    return resolved.with_name(resolved.name + "-work")
