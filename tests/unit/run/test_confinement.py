"""How Run confines a `command`: its processes, its user, its files, and what it leaves.

The pure parts (where the cgroup2 hierarchy is, which processes descend from which, owner
uid maps, which patterns of paths are refused) in isolation; the rest with the real
supervisor process (run/supervisor.py) and the real kernel: a subreaper without cgroups,
a cgroup, namespaces and another uid where the tests run as root (here and in CI, where a
test that needs root fails rather than skips).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.errors import InvalidRequest
from moonrun.run import leftovers
from moonrun.run.cgroups import Cgroups, cgroup2_mount, cgroup_directory, own_cgroup, tag
from moonrun.run.confinement import (
    DEFAULT_PATH,
    CommandUser,
    Confinement,
    child_environment,
    command_user_warning,
    default_work_root,
    make_work_root,
)
from moonrun.run.handlers.command import CommandHandler
from moonrun.run.leftovers import process_record, stop_left_behind
from moonrun.run.owners import OwnerIds, OwnerRangeFull, parse_range
from moonrun.run.resolve import open_without_links
from moonrun.run.supervisor import command_line, descendants
from tests.support import needs
from tests.support.run_kit import HANG_GUARD_S, Sink, command_context, finished

LEFT_BEHIND = "moonrun: stopped {} the command left behind"


def needs_root() -> None:
    needs.root("a cgroup, namespaces or another uid need Run to run as root")


# -- where the cgroup2 hierarchy is ------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
"""


def test_the_cgroup2_hierarchy_is_found_wherever_it_is_mounted() -> None:
    """mountinfo's first cgroup2 line, its optional fields skipped; none without one."""
    assert cgroup2_mount(MOUNTINFO) == ("/", "/sys/fs/cgroup/unified")
    assert cgroup2_mount(MOUNTINFO.replace("cgroup2 cgroup2", "cgroup cgroup")) is None
    escaped = "41 31 0:38 / /mnt/cgroup\\040two rw - cgroup2 none rw\n"
    assert cgroup2_mount(escaped) == ("/", "/mnt/cgroup two")


@pytest.mark.parametrize(
    ("mount_root", "own", "expected"),
    [
        ("/", "/", "/sys/fs/cgroup/unified"),
        (
            "/",
            "/system.slice/moonrun-run.service",
            "/sys/fs/cgroup/unified/system.slice/moonrun-run.service",
        ),
        ("/machine", "/machine/run", "/sys/fs/cgroup/unified/run"),
        ("/machine", "/other", None),
    ],
)
def test_runs_own_cgroup_is_where_it_makes_its_attempts_cgroups(
    mount_root: str, own: str, expected: str | None
) -> None:
    """The `0::` line of /proc/self/cgroup, within the mounted part of the hierarchy."""
    mountinfo = f"41 31 0:38 {mount_root} /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    proc_cgroup = f"4:memory:/x\n0::{own}\n"
    found = cgroup_directory(mountinfo, proc_cgroup)
    assert (str(found) if found is not None else None) == expected
    assert own_cgroup("1:cpu:/\n") is None


def test_an_attempts_cgroup_is_named_for_its_run_and_attempt(tmp_path: Path) -> None:
    """`moonrun.<tag of the data dir>.<job>.<attempt>`: one Run finds its own, never
    another's; characters a path could misuse are replaced."""
    cgroups = Cgroups(Path("/sys/fs/cgroup/unified"), tag(tmp_path))
    other = Cgroups(Path("/sys/fs/cgroup/unified"), tag(tmp_path / "other"))
    path = cgroups.path("job_../x", 3)
    assert path.name == f"moonrun.{tag(tmp_path)}.job____x.3"
    assert path.parent == Path("/sys/fs/cgroup/unified")
    assert cgroups.prefix != other.prefix


# -- which processes belong to an attempt ------------------------------------------------------


def test_an_attempts_processes_are_its_supervisors_live_descendants() -> None:
    """Children, their children (re-parented or not), never the supervisor itself, never a
    zombie, never another tree."""
    table = {
        10: (1, "S", 0, 10),
        11: (10, "S", 0, 11),
        12: (11, "R", 0, 11),
        13: (10, "Z", 0, 13),
        14: (12, "S", 0, 14),
        20: (1, "S", 0, 20),
        21: (20, "S", 0, 20),
    }
    assert descendants(10, table) == {11, 12, 14}
    assert descendants(99, table) == set()


# -- a uid per owner ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("60000-60999", (60000, 60999)), ("7-7", (7, 7))],
)
def test_a_run_as_range_is_first_to_last(text: str, expected: tuple[int, int]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["60000", "0-10", "10-9", "a-b", "-1-5", "1-2147483647"])
def test_a_bad_run_as_range_is_a_one_line_error(text: str) -> None:
    with pytest.raises(InvalidRequest, match="--run-as-range"):
        parse_range(text)


def free_numbers(count: int) -> int:
    """The first of `count` numbers in a row that name no user and no group here."""
    start = 300_000
    while True:
        block = range(start, start + count)
        if not any(_taken(n) for n in block):
            return start
        start += count


def _taken(number: int) -> bool:
    import grp

    for lookup in (pwd.getpwuid, grp.getgrgid):
        with contextlib.suppress(KeyError):
            lookup(number)
            return True
    return False


def test_each_owner_gets_a_uid_of_its_own_kept_across_restarts(tmp_path: Path) -> None:
    """Distinct owners, distinct uids; the same owner, the same uid, also after the map is
    read again from the data directory (0600); jobs that name no owner share one."""
    first = free_numbers(4)
    ids = OwnerIds(tmp_path, first, first + 3)
    alice, bob, alice_again = (
        ids.uid_for("usr_alice"),
        ids.uid_for("usr_bob"),
        ids.uid_for("usr_alice"),
    )
    nobody_a, nobody_b = ids.uid_for(None), ids.uid_for(None)
    reread = OwnerIds(tmp_path, first, first + 3)
    assert (alice, bob, alice_again) == (first, first + 1, first)
    assert nobody_a == nobody_b == first + 2
    assert (reread.uid_for("usr_bob"), reread.uids()) == (first + 1, {first, first + 1, first + 2})
    assert oct((tmp_path / "owner-ids.json").stat().st_mode & 0o777) == "0o600"


def test_a_uid_that_names_a_user_or_group_of_the_host_is_never_given() -> None:
    """The range's first number is a user of this host (`nobody`): the owner gets the next."""
    nobody = pwd.getpwnam("nobody").pw_uid
    ids = OwnerIds(Path("/nonexistent-never-written"), nobody, nobody)
    with pytest.raises(OwnerRangeFull, match="every uid of --run-as-range"):
        ids.uid_for("usr_alice")


@pytest.mark.anyio
async def test_an_owner_for_whom_the_range_has_no_uid_left_fails_its_attempt_not_run(
    tmp_path: Path,
) -> None:
    """A full range: the attempt fails owner_uids_exhausted (not retryable) and nothing
    runs; Run goes on."""
    nobody = pwd.getpwnam("nobody").pw_uid
    confinement = Confinement(work_root=tmp_path, owner_ids=OwnerIds(tmp_path, nobody, nobody))
    context = command_context(["sh", "-c", "echo ran"], owner_id="usr_alice")

    result = await finished(CommandHandler(confinement), context)

    assert (result.outcome, result.retryable) == ("failed", False)
    assert result.error is not None
    assert result.error["code"] == "owner_uids_exhausted"
    assert list(tmp_path.iterdir()) == []


# -- the work root -----------------------------------------------------------------------------


def test_the_work_root_is_beside_the_data_dir_and_0711_whatever_it_was(tmp_path: Path) -> None:
    """`<data dir>-work`, made 0711 (others may reach their own directory, never list it)."""
    root = default_work_root(tmp_path / "run-data")
    assert root == tmp_path.resolve() / "run-data-work"
    root.mkdir(mode=0o777)
    make_work_root(root)
    assert oct(root.stat().st_mode & 0o777) == "0o711"


def test_a_work_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidRequest, match="--work-dir"):
        make_work_root(tmp_path / "work")


# -- artifact paths: no link at any point ------------------------------------------------------


@pytest.fixture(params=["openat2", "walk"])
def walk(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "walk")


def test_a_symlinked_directory_on_a_path_is_refused(tmp_path: Path, walk: bool) -> None:
    """`d/key` where `d` links to another directory: ELOOP, with openat2 or the walk."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("k")
    work = tmp_path / "work"
    work.mkdir()
    (work / "d").symlink_to(tmp_path / "secret")
    (work / "real").mkdir()
    (work / "real" / "out").write_text("ok")

    with pytest.raises(OSError, match="symbolic links") as refused:
        open_without_links(work, "d/key", os.O_RDONLY, walk=walk)
    fd = open_without_links(work, "real/out", os.O_RDONLY, walk=walk)
    with os.fdopen(fd) as opened:
        assert opened.read() == "ok"
    assert refused.value.errno == errno.ELOOP


@pytest.mark.parametrize("path", ["../secret/key", "real/../../secret/key"])
def test_a_path_with_a_dot_dot_component_is_refused(tmp_path: Path, walk: bool, path: str) -> None:
    (tmp_path / "work" / "real").mkdir(parents=True)
    with pytest.raises(OSError, match="a path with a '\\.\\.' component") as refused:
        open_without_links(tmp_path / "work", path, os.O_RDONLY, walk=walk)
    assert refused.value.errno == errno.EXDEV


def test_an_absolute_path_is_resolved_from_the_root_without_links(
    tmp_path: Path, walk: bool
) -> None:
    (tmp_path / "f").write_text("abs")
    (tmp_path / "link").symlink_to(tmp_path)
    fd = open_without_links(Path("/nonexistent"), str(tmp_path / "f"), os.O_RDONLY, walk=walk)
    os.close(fd)
    with pytest.raises(OSError, match="symbolic links") as refused:
        open_without_links(
            Path("/nonexistent"), str(tmp_path / "link" / "f"), os.O_RDONLY, walk=walk
        )
    assert refused.value.errno == errno.ELOOP


# -- the command handler, with its supervisor --------------------------------------------------


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def pid_file(tmp_path: Path) -> Iterator[Path]:
    """A file a command writes a PID to; that process is SIGKILLed at the end anyway."""
    path = tmp_path / "left.pid"
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)


DETACH = "(setsid sh -c 'echo $$ > {pid}; exec sleep 300' </dev/null >/dev/null 2>&1 &)"


@pytest.mark.anyio
async def test_without_a_cgroup_the_supervisor_stops_a_detached_process_left_behind(
    tmp_path: Path,
) -> None:
    """No cgroup (the subreaper alone): a double-forked, setsid'd process is re-parented to
    the supervisor, stopped once the main process exited, and the job's stderr log says so;
    the attempt still succeeds."""
    sink = Sink()
    with pid_file(tmp_path) as pid:
        script = DETACH.format(pid=pid) + f"; while [ ! -s {pid} ]; do sleep 0.01; done"
        result = await finished(
            CommandHandler(Confinement(work_root=tmp_path)),
            command_context(["sh", "-c", script], sink),
        )
        left = int(pid.read_text())
        assert (result.outcome, alive(left)) == ("succeeded", False)
    assert sink.stream("stderr") == [LEFT_BEHIND.format("1 process")]


@pytest.mark.anyio
@pytest.mark.parametrize("stop_by", ["timeout", "cancel"])
async def test_a_timeout_or_cancel_stops_a_setsid_child_holding_the_output(
    tmp_path: Path, stop_by: str
) -> None:
    """A setsid'd child keeps stdout open (Run used to wait for it): a timeout or a cancel
    still ends the attempt, and the child is gone by then; no line about left processes (the
    attempt was stopped, nothing was left)."""
    sink = Sink()
    with pid_file(tmp_path) as pid:
        script = f"setsid sh -c 'echo $$ > {pid}; exec sleep 300' & echo ready; sleep 300"
        extra = {"timeout_s": 0.5} if stop_by == "timeout" else {}
        context = command_context(["sh", "-c", script], sink, **extra)
        work = asyncio.create_task(CommandHandler(Confinement(work_root=tmp_path)).run(context))
        while ("stdout", "ready") not in sink.lines or not pid.exists() or not pid.read_text():
            await asyncio.sleep(0.01)
        if stop_by == "cancel":
            context.cancelled.set()
        result = await asyncio.wait_for(work, HANG_GUARD_S)
        left = int(pid.read_text())
        assert (result.outcome, alive(left)) == (
            "failed" if stop_by == "timeout" else "cancelled",
            False,
        )
    assert sink.stream("stderr") == []


@pytest.mark.anyio
async def test_run_journals_what_a_restart_needs_to_stop_the_attempt(tmp_path: Path) -> None:
    """The record names the supervisor (pgid and start), the working directory, and without
    namespaces the command's session as the host sees it."""
    sink = Sink()
    result = await finished(
        CommandHandler(Confinement(work_root=tmp_path)),
        command_context(["sh", "-c", "echo $$"], sink),
    )
    (record,) = sink.records
    assert result.outcome == "succeeded"
    assert set(record) == {"pgid", "started", "cgroup", "workdir", "session", "session_started"}
    assert record["session"] == int(sink.stream("stdout")[0])
    assert Path(record["workdir"]).parent == tmp_path


@pytest.mark.anyio
async def test_an_artifact_behind_a_symlinked_directory_is_not_uploaded(tmp_path: Path) -> None:
    """A command links a directory of Run's (`d -> secret/`) into its working directory and
    names `d/key`: not uploaded (it used to be: only the last component was checked), and
    the job's log says why."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("Run's own")
    work = tmp_path / "work"
    work.mkdir()
    sink = Sink()
    context = command_context(
        ["sh", "-c", f"ln -s {tmp_path / 'secret'} d; mkdir real; echo ok > real/out"],
        sink,
        artifacts=[{"path": "d/key", "name": "key"}, {"path": "real/out", "name": "out"}],
    )

    result = await finished(CommandHandler(Confinement(work_root=work)), context)

    assert result.outcome == "succeeded"
    assert [name for _, name in sink.uploads] == ["out"]
    for source, _ in sink.uploads:
        source.close()
    assert sink.stream("stderr") == ["artifact key not uploaded: a symbolic link"]


# -- as root: a cgroup, namespaces, another uid -----------------------------------------------


@pytest.fixture
def attempt_cgroups(tmp_path: Path) -> Cgroups:
    needs_root()
    cgroups = Cgroups.of_this_process(tmp_path)
    if cgroups is None or (why := cgroups.usable()) is not None:
        pytest.skip("no cgroup2 hierarchy Run may write to here")
        raise AssertionError(why)
    return cgroups


@pytest.mark.anyio
async def test_an_attempts_processes_run_in_a_cgroup_of_its_own_removed_afterwards(
    tmp_path: Path, attempt_cgroups: Cgroups
) -> None:
    """With a cgroup: the command runs in `moonrun.<tag>.job_1.1`, which is gone once the
    attempt ended; a detached process left behind is stopped all the same."""
    sink = Sink()
    with pid_file(tmp_path) as pid:
        script = (
            "cat /proc/self/cgroup; "
            + DETACH.format(pid=pid)
            + f"; while [ ! -s {pid} ]; do sleep 0.01; done"
        )
        result = await finished(
            CommandHandler(Confinement(work_root=tmp_path, cgroups=attempt_cgroups)),
            command_context(["sh", "-c", script], sink),
        )
        left = int(pid.read_text())
    where = next(line[3:] for line in sink.stream("stdout") if line.startswith("0::"))
    assert (result.outcome, alive(left)) == ("succeeded", False)
    assert where.rpartition("/")[2] == attempt_cgroups.path("job_1", 1).name
    assert not attempt_cgroups.path("job_1", 1).exists()
    assert sink.stream("stderr") == [LEFT_BEHIND.format("1 process")]


@pytest.fixture
def namespaces() -> None:
    needs_root()
    probe = subprocess.run(command_line("--probe-namespaces"), capture_output=True)
    if probe.returncode != 0:  # a host capability, not a matter of root: said, not failed
        pytest.skip(f"this host allows no new namespaces: {probe.stderr!r}")


@pytest.mark.anyio
async def test_an_owners_command_runs_under_its_uid_with_a_private_tmp_and_pid_view(
    tmp_path: Path, namespaces: None
) -> None:
    """`--run-as-range` with namespaces: the command runs as the owner's uid and gid (no
    other group), HOME is its working directory (0700, its own), /tmp is empty and its own,
    and it sees only its attempt's processes (its shell is PID 2)."""
    (Path("/tmp") / f"moonrun-test-visible-{os.getpid()}").write_text("host")
    first = free_numbers(2)
    confinement = Confinement(
        work_root=tmp_path,
        owner_ids=OwnerIds(tmp_path, first, first + 1),
        namespaces=True,
    )
    sink = Sink()
    script = (
        "id -u; id -g; id -G; echo $HOME; ls -A /tmp | wc -l; echo $$; ls /proc | grep -c '^[0-9]'"
    )
    try:
        result = await finished(
            CommandHandler(confinement),
            command_context(["sh", "-c", script], sink, owner_id="usr_a"),
        )
    finally:
        (Path("/tmp") / f"moonrun-test-visible-{os.getpid()}").unlink()
    uid, gid, groups, home, in_tmp, shell, processes = sink.stream("stdout")
    assert result.outcome == "succeeded", sink.lines
    assert (uid, gid, groups) == (str(first), str(first), str(first))
    assert (Path(home).parent, in_tmp, shell) == (tmp_path, "0", "2")
    assert int(processes) <= 4  # PID 1 (the supervisor), the shell, `ls` and `grep`


def test_a_restart_kills_what_works_in_a_left_working_directory_and_removes_it(
    tmp_path: Path,
) -> None:
    """A record naming a working directory: a process whose working directory is there (its
    supervisor and session gone) is killed, and the directory removed."""
    workdir = tmp_path / "moonrun-job_1-1-x"
    workdir.mkdir()
    process = subprocess.Popen(["sleep", "300"], cwd=workdir, start_new_session=True)
    try:
        found = leftovers.stop_left_behind({"pgid": 0, "workdir": str(workdir)}, grace_s=0)
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (dict(found), workdir.exists()) == ({"processes": 1, "workdirs": 1}, False)


def test_an_owner_user_has_no_home_but_its_working_directory() -> None:
    user = CommandUser.of_owner(300_000)
    environment = Confinement(environment={"PATH": "/bin"}).environment_for(user, Path("/w/x"))
    assert environment == {
        "PATH": "/bin",
        "HOME": "/w/x",
        "USER": "moonrun-300000",
        "LOGNAME": "moonrun-300000",
    }


def test_a_restart_kills_what_is_left_of_a_recorded_session_and_nothing_older(
    tmp_path: Path,
) -> None:
    """Without a cgroup, and the supervisor gone: the record's session (the command's) is
    killed, members started before the recorded command never (a reused session id)."""
    process = subprocess.Popen(["sleep", "300"], cwd=tmp_path, start_new_session=True)
    try:
        started = leftovers.start_ticks(process.pid)
        assert started is not None
        older = {"pgid": 0, "session": process.pid, "session_started": started + 1}
        leftovers.stop_left_behind(older, grace_s=0)
        survived = process.poll() is None
        found = leftovers.stop_left_behind(
            {"pgid": 0, "session": process.pid, "session_started": started}, grace_s=0
        )
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (survived, dict(found)) == (True, {"processes": 1})


# -- what a command can reach ---------------------------------------------------------------------

SOMEONE = CommandUser("someone", 4321, 4321, (4321, 27), "/home/someone")


def test_a_commands_environment_holds_only_the_allow_list_and_its_users_home() -> None:
    """Of Run's environment a command gets PATH, LANG, LC_*, TZ and TMPDIR; HOME, USER and
    LOGNAME are its user's; tokens, MOONRUN_* settings and everything else stay behind."""
    runs = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_TIME": "en_GB.UTF-8",
        "TZ": "UTC",
        "TMPDIR": "/var/tmp",
        "HOME": "/root",
        "USER": "root",
        "MOONRUN_JOIN_TOKEN": "mrj_secret",
        "MOONRUN_BOOTSTRAP_ADMIN_TOKEN": "mra_secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "SSH_AUTH_SOCK": "/run/agent.sock",
    }

    environment = child_environment(runs, SOMEONE)

    assert environment == {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_TIME": "en_GB.UTF-8",
        "TZ": "UTC",
        "TMPDIR": "/var/tmp",
        "HOME": "/home/someone",
        "USER": "someone",
        "LOGNAME": "someone",
    }


def test_a_command_gets_a_default_path_when_run_has_none() -> None:
    """No PATH in Run's environment: commands still find the usual programs."""
    assert child_environment({}, SOMEONE)["PATH"] == DEFAULT_PATH


@pytest.mark.parametrize(
    ("command_uid", "euid", "warned"),
    [
        (0, 0, "commands run as root"),
        (1000, 1000, "commands run as Run's own user"),
        (4321, 0, None),
    ],
    ids=["root", "run's-own-user", "another-user"],
)
def test_run_warns_at_start_unless_commands_run_as_another_user(
    command_uid: int, euid: int, warned: str | None
) -> None:
    """Root commands (and commands as Run's own user) are warned about, with the advice to
    use --run-as; commands as another, unprivileged user are not."""
    user = CommandUser("user", command_uid, command_uid, (), "/")

    warning = command_user_warning(user, euid)

    assert (warning and warning.split(":")[0], warning and "--run-as USER" in warning) == (
        warned,
        warned and True,
    )


def test_an_unknown_run_as_user_is_a_one_line_error() -> None:
    """--run-as naming no user on this host: InvalidRequest naming it."""
    with pytest.raises(InvalidRequest, match="no user 'no-such-user-here'"):
        CommandUser.named("no-such-user-here")


@pytest.mark.anyio
async def test_a_command_runs_in_a_working_directory_of_its_own_removed_afterwards(
    tmp_path: Path,
) -> None:
    """Each attempt starts in a new empty directory under the work root, gone once it ended."""
    sink = Sink()
    handler = CommandHandler(Confinement(work_root=tmp_path))
    script = "pwd; ls -A | wc -l; touch left-behind"

    result = await finished(handler, command_context(["sh", "-c", script], sink))

    assert result.outcome == "succeeded"
    workdir, entries = sink.stream("stdout")
    assert (Path(workdir).parent, Path(workdir).name.startswith("moonrun-job_1-1-")) == (
        tmp_path,
        True,
    )
    assert (entries.strip(), list(tmp_path.iterdir())) == ("0", [])


def test_a_process_group_left_behind_is_stopped_only_if_it_is_still_the_same() -> None:
    """A journaled group is killed after a Run restart; a recycled pid's group is left alone."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = process_record(process.pid)
        stop_left_behind({**record, "started": record["started"] + 1}, grace_s=0.2)
        assert process.poll() is None  # another start time: not ours to kill
        stop_left_behind(record, grace_s=0.2)
        assert process.wait(timeout=5) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
