"""What attempts leave behind, found and stopped: processes, cgroups, working directories.

An attempt's `process` record (journaled) names its supervisor (`pgid`, `started`), and
where they exist its cgroup, its working directory and its command's session. A restarted
Run stops what a record names: the supervisor's group (SIGTERM, then SIGKILL after the grace),
everything in the cgroup (`cgroup.kill`), every process of the command's session started no
earlier than the command, and every process whose working directory lies in the attempt's;
then it removes the cgroup and the working directory. Records of an older Run hold only
`pgid` and `started`: its process group is stopped as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from moonrun.run import cgroups


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def process_record(pid: int) -> dict[str, Any]:
    """What identifies a process group leader beyond its (reusable) pid."""
    return {"pgid": pid, "started": start_ticks(pid) or 0}


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_processes() -> list[int]:
    """Every process /proc shows that is not a zombie, but this one."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            fields = _stat_fields(int(name))
            if fields and fields[0] not in ("Z", "X"):
                found.append(int(name))
    return found


def in_session(session: int, since_ticks: int) -> Callable[[int], bool]:
    """Members of session `session` started no earlier than `since_ticks` (a session id
    reused after the recorded one ended holds only processes started later than it: the
    check keeps out none of those, but an older process never matches)."""

    def test(pid: int) -> bool:
        fields = _stat_fields(pid)
        return (
            fields is not None
            and len(fields) > 19
            and int(fields[3]) == session
            and int(fields[19]) >= since_ticks
        )

    return test


def working_in(directory: Path) -> Callable[[int], bool]:
    """Processes whose working directory is `directory` or lies below it."""
    inside = str(directory).rstrip("/") + "/"

    def test(pid: int) -> bool:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        cwd = cwd.removesuffix(" (deleted)")
        return cwd == inside[:-1] or cwd.startswith(inside)

    return test


def owned_by(uids: set[int]) -> Callable[[int], bool]:
    """Processes with one of `uids` as their real, effective or saved uid."""

    def test(pid: int) -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        for line in status.splitlines():
            if line.startswith("Uid:"):
                return any(int(uid) in uids for uid in line.split()[1:4])
        return False

    return test


def kill_matching(*tests: Callable[[int], bool]) -> int:
    """SIGKILL every process that passes one of `tests`, again until none is left (at most a
    few rounds: a process may fork meanwhile); how many were killed (blocking)."""
    killed: set[int] = set()
    for _ in range(20):
        found = [pid for pid in live_processes() if any(test(pid) for test in tests)]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed.update(found)
        time.sleep(0.02)
    return len(killed)


def stop_group(pgid: int, started: int | None, grace_s: float) -> None:
    """SIGTERM a process group whose leader is the recorded one, SIGKILL after the grace.

    A pid cannot be reused while a process group of that id has members; a leader found
    with another start time means the old group is gone and the pid belongs to someone else.
    """
    if pgid <= 1 or not group_alive(pgid):
        return
    found = start_ticks(pgid)
    if found is not None and found != started:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def stop_left_behind(record: dict[str, Any], grace_s: float) -> Counter[str]:
    """Stop everything an attempt's record names, and remove its cgroup and working
    directory (blocking); how many processes, cgroups and working directories were found."""
    found: Counter[str] = Counter()
    pgid = int(record.get("pgid") or 0)
    if pgid > 1 and group_alive(pgid) and start_ticks(pgid) == record.get("started"):
        found["processes"] += 1
    stop_group(pgid, record.get("started"), grace_s)
    if record.get("cgroup"):
        found += remove_cgroup(Path(record["cgroup"]))
    tests: list[Callable[[int], bool]] = []
    if record.get("session"):
        tests.append(in_session(int(record["session"]), int(record.get("session_started") or 0)))
    if record.get("workdir"):
        tests.append(working_in(Path(record["workdir"])))
    if tests:
        found["processes"] += kill_matching(*tests)
    if record.get("workdir") and Path(record["workdir"]).exists():
        found["workdirs"] += 1
        remove_workdir(Path(record["workdir"]))
    return found


def remove_cgroup(path: Path) -> Counter[str]:
    """Kill what is in an attempt's cgroup and remove it; what was found."""
    found: Counter[str] = Counter()
    if path.is_dir():
        found["cgroups"] += 1
        with contextlib.suppress(OSError):
            found["processes"] += len((path / "cgroup.procs").read_text().split())
        cgroups.remove(path)
    return found


def sweep(
    records: Iterable[dict[str, Any]],
    work_root: Path | None,
    attempt_cgroups: cgroups.Cgroups | None,
    owner_uids: set[int],
    grace_s: float,
) -> dict[str, int]:
    """At Run's start, before it holds any attempt: stop and remove whatever attempts of a
    previous Run process left (blocking); how many processes, cgroups and working
    directories were found.

    Every journaled record's supervisor group gets the grace at once (together, not one
    after another); then what each record names is stopped and removed; then every attempt
    cgroup of this Run, every process with an owner's uid (`--run-as-range`: no attempt runs,
    none may) or working in the work root is killed, and the work root is emptied.
    """
    records = list(records)
    for record in records:
        pgid = int(record.get("pgid") or 0)
        if pgid > 1 and group_alive(pgid) and start_ticks(pgid) == record.get("started"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for record in records:
        pgid = int(record.get("pgid") or 0)
        while pgid > 1 and time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.05)
    found: Counter[str] = Counter()
    for record in records:
        found += stop_left_behind(record, grace_s=0.0)
    for path in attempt_cgroups.left_behind() if attempt_cgroups is not None else []:
        found += remove_cgroup(path)
    tests: list[Callable[[int], bool]] = []
    if owner_uids:
        tests.append(owned_by(owner_uids))
    if work_root is not None:
        tests.append(working_in(work_root))
    if tests:
        found["processes"] += kill_matching(*tests)
    for path in work_root.iterdir() if work_root is not None and work_root.is_dir() else []:
        found["workdirs"] += 1
        remove_workdir(path)
    return dict(found)


def remove_workdir(path: Path) -> None:
    """Remove an attempt's working directory and whatever the command left in it."""
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(OSError):
            path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)
