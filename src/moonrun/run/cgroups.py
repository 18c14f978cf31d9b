"""Per-attempt cgroups (v2): every process of an attempt in one cgroup, killed at once.

Run makes each attempt's cgroup as a child of its own (`/proc/self/cgroup`) in the cgroup2
hierarchy (found in `/proc/self/mountinfo`, wherever it is mounted), named
`moonrun.<tag>.<job>.<attempt>` where the tag stands for Run's data directory, so that a
restarted Run finds (and kills) what its predecessor left there and nothing of another Run's.
The attempt's supervisor joins it before it starts anything; Run kills what is left in it
with `cgroup.kill` (Linux 5.14) once the attempt ends, and removes it. Without a cgroup2
hierarchy Run may write to (not root, a read-only mount, an older kernel), `usable` says
why and Run relies on the supervisor's subreaper alone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "moonrun."
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """The first cgroup2 mount in `/proc/self/mountinfo` text: (its root within the
    hierarchy, where it is mounted); None without one."""
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, kind = before.split(), after.split()[:1]
        if kind == ["cgroup2"] and len(fields) >= 5:
            return _unescape(fields[3]), _unescape(fields[4])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup2 path in `/proc/self/cgroup` text (the `0::` line)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def cgroup_directory(mountinfo: str, proc_cgroup: str) -> Path | None:
    """The directory of this process's own cgroup; None when there is no cgroup2 hierarchy
    or the process's cgroup lies outside the mounted part of it."""
    mount, own = cgroup2_mount(mountinfo), own_cgroup(proc_cgroup)
    if mount is None or own is None:
        return None
    root, where = mount
    if root != "/" and own != root and not own.startswith(root.rstrip("/") + "/"):
        return None
    inside = own[len(root) :] if root != "/" else own
    return Path(where) / inside.lstrip("/")


def tag(data_dir: Path) -> str:
    """What names one Run's cgroups: a digest of its data directory's real path."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Cgroups:
    """Where this Run makes its attempts' cgroups, and how they are named."""

    parent: Path
    tag: str

    @classmethod
    def of_this_process(cls, data_dir: Path) -> Cgroups | None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
        parent = cgroup_directory(mountinfo, proc_cgroup)
        return None if parent is None else cls(parent, tag(data_dir))

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.tag}."

    def path(self, job_id: str, attempt: int) -> Path:
        return self.parent / f"{self.prefix}{_UNSAFE.sub('_', job_id)}.{attempt}"

    def usable(self) -> str | None:
        """Why attempt cgroups cannot be made here; None when they can (blocking: makes and
        removes one)."""
        probe = self.parent / f"{self.prefix}probe.{os.getpid()}"
        try:
            probe.mkdir()
        except FileExistsError:
            pass
        except OSError as error:
            return f"cannot make a cgroup in {self.parent}: {error.strerror}"
        try:
            if not (probe / "cgroup.kill").exists():
                return "the kernel has no cgroup.kill (Linux 5.14 or later)"
            return None
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()

    def make(self, job_id: str, attempt: int) -> Path:
        """A new, empty cgroup for one attempt (one left by a predecessor is emptied first)."""
        path = self.path(job_id, attempt)
        try:
            path.mkdir()
        except FileExistsError:
            remove(path)
            path.mkdir()
        return path

    def left_behind(self) -> list[Path]:
        """Every attempt cgroup of this Run that exists now."""
        try:
            names = os.listdir(self.parent)
        except OSError:
            return []
        return [self.parent / name for name in names if name.startswith(self.prefix)]


def populated(path: Path) -> bool:
    try:
        return "populated 1" in (path / "cgroup.events").read_text()
    except OSError:
        return False


def remove(path: Path, timeout_s: float = 5.0) -> bool:
    """Kill whatever is in the cgroup and remove it (blocking); False when it is still there
    after `timeout_s` (a process stuck in the kernel), True when it is gone."""
    if not path.is_dir():
        return True
    if populated(path):
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        time.sleep(0.01)
