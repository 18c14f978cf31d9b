"""Run's modules one at a time, without a platform: identity, handlers, transfers and the
client's error mapping (docs/protocol.md, "Credentials", "Claims and leases", "Logs" and "Run's
own choices"). The journal has its own suite (tests/unit/run/test_journal.py).

Handlers run directly with a `JobContext` built here; `command` starts real processes (tiny
shell scripts) and checks that their whole process group is gone afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from moonrun.errors import (
    AckDeadlineExpired,
    AlreadyExists,
    ArtifactConflict,
    ChannelBusy,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    JobNotFound,
    JoinTokenInvalid,
    LeaseExpired,
    LeaseMismatch,
    MoonrunError,
    NoCancelIntent,
    NotActive,
    NotFound,
    ReconcileRequired,
    Replayed,
    SequenceRegression,
    SessionExpired,
    SessionRotated,
    SignatureExpired,
    SignatureInvalid,
    SignatureMissing,
    StaleAttempt,
    TerminalConflict,
    TooLarge,
    Unauthenticated,
    WrongEndpoint,
)
from moonrun.http.platform import HttpSettings
from moonrun.run import handlers as handlers_module
from moonrun.run import identity, transfers
from moonrun.run.client import SESSION_ERRORS, TRANSIENT, Unreachable, error_from
from moonrun.run.confinement import (
    DEFAULT_PATH,
    CommandUser,
    Confinement,
    child_environment,
    command_user_warning,
)
from moonrun.run.handlers import ENTRY_POINT_GROUP, HandlerResult, JobContext, load_handlers
from moonrun.run.handlers.command import CONTINUED, LINE_BYTES, CommandHandler
from moonrun.run.handlers.noop import NoopHandler
from moonrun.run.handlers.sleep import SleepHandler
from moonrun.run.journal import Journal
from moonrun.run.transfers import CHUNK_BYTES, ArtifactUploader, Attempt, LogShipper

T0_MS = 1_795_000_000_000
LEASE = "mrl_" + "l" * 43
HANG_GUARD_S = 10.0
"""Only a guard against a hang; every wait below is expected to end well before it."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


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

    result = await finished(handler, job_context("command", {"argv": ["sh", "-c", script]}, sink))

    assert result.outcome == "succeeded"
    workdir, entries = sink.stream("stdout")
    assert (Path(workdir).parent, Path(workdir).name.startswith("moonrun-job_1-1-")) == (
        tmp_path,
        True,
    )
    assert (entries.strip(), list(tmp_path.iterdir())) == ("0", [])


# -- handlers: helpers ------------------------------------------------------------------------


@dataclass
class Sink:
    """What a handler handed back: log lines per stream, uploads."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    uploads: list[tuple[Any, str]] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)

    def log_line(self, stream: str, text: str) -> None:
        self.lines.append((stream, text))

    def upload(self, source: Any, name: str) -> None:
        self.uploads.append((source, name))

    async def remember_process(self, pid: int) -> None:
        self.processes.append(pid)

    def stream(self, name: str) -> list[str]:
        return [text for stream, text in self.lines if stream == name]


def job_context(
    kind: str,
    payload: Any,
    sink: Sink | None = None,
    *,
    started_at_ms: int | None = None,
    now_ms: Callable[[], int] = wall_ms,
    grace_s: float = 10.0,
) -> JobContext:
    sink = sink or Sink()
    return JobContext(
        job_id="job_1",
        attempt=1,
        kind=kind,
        payload=payload,
        started_at_ms=now_ms() if started_at_ms is None else started_at_ms,
        now_ms=now_ms,
        log_line=sink.log_line,
        upload=sink.upload,
        remember_process=sink.remember_process,
        grace_s=grace_s,
    )


async def finished(handler: Any, context: JobContext) -> HandlerResult:
    result: HandlerResult = await asyncio.wait_for(handler.run(context), HANG_GUARD_S)
    return result


# -- noop and sleep -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_noop_succeeds_at_once() -> None:
    """noop: succeeded, progress 100 %."""
    context = job_context("noop", None)

    result = await finished(NoopHandler(), context)

    assert (result, context.percent) == (HandlerResult("succeeded"), 100.0)


@pytest.mark.anyio
async def test_sleep_succeeds_once_its_seconds_have_passed() -> None:
    """sleep 0.3 s: takes about that long, then succeeded with the seconds slept."""
    sink = Sink()
    context = job_context("sleep", {"seconds": 0.3}, sink)
    began = time.monotonic()

    result = await finished(SleepHandler(), context)

    elapsed = time.monotonic() - began
    assert result == HandlerResult("succeeded", output={"slept_s": 0.3})
    assert 0.25 <= elapsed < 2.0
    assert (context.percent, context.message) == (100.0, "slept")
    assert sink.lines == [("stdout", "slept 0.3 s")]


class SteppingClock:
    """A clock that moves to the next reading each time it is read, noting the progress seen."""

    def __init__(self, readings: list[int]) -> None:
        self.readings = readings
        self.reads = 0
        self.context: JobContext | None = None
        self.percents_seen: list[float | None] = []

    def __call__(self) -> int:
        if self.context is not None:
            self.percents_seen.append(self.context.percent)
        reading = self.readings[min(self.reads, len(self.readings) - 1)]
        self.reads += 1
        return reading


@pytest.mark.anyio
async def test_sleep_reports_progress_as_its_clock_advances() -> None:
    """Each tick reports the share of time passed and what is left, on the handler's clock."""
    clock = SteppingClock([T0_MS + 970, T0_MS + 980, T0_MS + 990, T0_MS + 1000])
    context = job_context("sleep", {"seconds": 1}, started_at_ms=T0_MS, now_ms=clock)
    clock.context = context

    result = await finished(SleepHandler(), context)

    assert result.outcome == "succeeded"
    assert clock.percents_seen == pytest.approx([None, 97.0, 98.0, 99.0])
    assert (context.percent, context.message) == (100.0, "slept")


@pytest.mark.anyio
async def test_sleep_goes_by_its_clock_not_by_real_time() -> None:
    """An hour's sleep ends as soon as the clock says the hour has passed."""
    clock = SteppingClock([T0_MS + 3_599_990, T0_MS + 3_600_000])
    context = job_context("sleep", {"seconds": 3600}, started_at_ms=T0_MS, now_ms=clock)
    began = time.monotonic()

    result = await finished(SleepHandler(), context)

    assert result == HandlerResult("succeeded", output={"slept_s": 3600})
    assert time.monotonic() - began < 1.0


@pytest.mark.anyio
async def test_sleep_is_cancellable() -> None:
    """Setting context.cancelled ends a long sleep at once with outcome cancelled."""
    context = job_context("sleep", {"seconds": 60})
    work = asyncio.create_task(SleepHandler().run(context))
    await asyncio.sleep(0.05)
    began = time.monotonic()

    context.cancelled.set()
    result = await asyncio.wait_for(work, HANG_GUARD_S)

    assert result == HandlerResult("cancelled")
    assert time.monotonic() - began < 0.5


@pytest.mark.anyio
async def test_sleep_cancelled_before_it_starts_does_not_sleep() -> None:
    """A cancel already requested (seen at the first poll) ends the sleep at once."""
    context = job_context("sleep", {"seconds": 60})
    context.cancelled.set()

    result = await finished(SleepHandler(), context)

    assert result == HandlerResult("cancelled")


@pytest.mark.anyio
async def test_sleep_resumes_with_only_the_remaining_time() -> None:
    """An attempt started 59.8 s ago sleeping 60 s finishes about 0.2 s after resuming."""
    context = job_context("sleep", {"seconds": 60}, started_at_ms=wall_ms() - 59_800)
    began = time.monotonic()

    result = await finished(SleepHandler(), context)

    assert result.outcome == "succeeded"
    assert 0.1 <= time.monotonic() - began < 1.0


@pytest.mark.anyio
async def test_sleep_whose_time_passed_while_run_was_down_ends_at_once() -> None:
    """Resumed after its whole time passed: succeeded without sleeping again."""
    context = job_context("sleep", {"seconds": 5}, started_at_ms=wall_ms() - 10_000)
    began = time.monotonic()

    result = await finished(SleepHandler(), context)

    assert result.outcome == "succeeded"
    assert time.monotonic() - began < 0.1


@pytest.mark.anyio
@pytest.mark.parametrize(("fail", "retryable"), [("retryable", True), ("fatal", False)])
async def test_sleep_fails_as_asked(fail: str, retryable: bool) -> None:
    """fail=retryable|fatal: failed, code sleep_failed, retryable as asked."""
    context = job_context("sleep", {"seconds": 0, "fail": fail})

    result = await finished(SleepHandler(), context)

    expected = HandlerResult(
        "failed", retryable, {"code": "sleep_failed", "message": "failed as asked"}
    )
    assert result == expected


@pytest.mark.anyio
@pytest.mark.parametrize(
    "payload",
    [
        {"seconds": -1},
        {"seconds": "5"},
        {"seconds": True},
        {"seconds": 604_801},
        {"seconds": float("inf")},
        {"seconds": float("nan")},
        {"seconds": 1, "fail": "sometimes"},
        {"seconds": 1, "fail": True},
    ],
    ids=repr,
)
async def test_sleep_with_a_bad_payload_fails_bad_payload(payload: Any) -> None:
    """Malformed seconds or fail: failed, code bad_payload, not retryable, no sleeping."""
    context = job_context("sleep", payload)

    result = await finished(SleepHandler(), context)

    assert (result.outcome, result.retryable, result.error and result.error["code"]) == (
        "failed",
        False,
        "bad_payload",
    )


# -- command ------------------------------------------------------------------------------------


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies awaiting a reaper excluded)."""
    if not Path("/proc/self/stat").exists():  # no procfs: ask the kernel about the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = text.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


async def group_gone(pgid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while live_group_members(pgid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def wait_for_line(sink: Sink, text: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while ("stdout", text) not in sink.lines:
        assert time.monotonic() < deadline, f"no {text!r} line; got {sink.lines}"
        await asyncio.sleep(0.01)


def read_pid(pidfile: Path) -> int:
    return int(pidfile.read_text().strip())


@pytest.mark.anyio
async def test_command_succeeds_with_its_output_lines_in_order_per_stream() -> None:
    """stdout and stderr arrive line by line, each stream in order; output is the exit code."""
    script = "echo one; echo uno >&2; echo two; echo dos >&2; printf 'three'"
    sink = Sink()

    result = await finished(
        CommandHandler(), job_context("command", {"argv": ["sh", "-c", script]}, sink)
    )

    assert result == HandlerResult("succeeded", output={"exit_code": 0})
    assert sink.stream("stdout") == ["one", "two", "three"]
    assert sink.stream("stderr") == ["uno", "dos"]


@pytest.mark.anyio
async def test_command_runs_argv_without_a_shell() -> None:
    """argv goes to exec as is: shell syntax in an argument is just text."""
    sink = Sink()

    await finished(CommandHandler(), job_context("command", {"argv": ["echo", "$HOME; x"]}, sink))

    assert sink.stream("stdout") == ["$HOME; x"]


@pytest.mark.anyio
async def test_command_with_a_non_zero_exit_fails_exit_status_not_retryable() -> None:
    """Exit 3: failed, code exit_status, not retryable, the status in the message."""
    context = job_context("command", {"argv": ["sh", "-c", "exit 3"]})

    result = await finished(CommandHandler(), context)

    assert (result.outcome, result.retryable) == ("failed", False)
    assert result.error == {"code": "exit_status", "message": "sh exited with status 3"}


@pytest.mark.anyio
async def test_command_over_its_timeout_fails_retryable_and_is_killed(tmp_path: Path) -> None:
    """timeout_s passed: failed, code timeout, retryable; the process group is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; sleep 30"
    context = job_context("command", {"argv": ["sh", "-c", script], "timeout_s": 0.3}, grace_s=0.5)
    began = time.monotonic()

    result = await finished(CommandHandler(), context)

    assert (result.outcome, result.retryable) == ("failed", True)
    assert result.error is not None
    assert result.error["code"] == "timeout"
    assert 0.25 <= time.monotonic() - began < 3.0
    assert await group_gone(read_pid(pidfile))


@pytest.mark.anyio
async def test_cancelling_a_command_sends_sigterm_first(tmp_path: Path) -> None:
    """A command that handles SIGTERM exits on it, well within the grace: outcome cancelled."""
    pidfile = tmp_path / "pid"
    script = (
        f"echo $$ > {pidfile}; trap 'echo terminated; exit 143' TERM; echo ready; sleep 30 & wait"
    )
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=5.0)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    began = time.monotonic()

    context.cancelled.set()
    result = await asyncio.wait_for(work, HANG_GUARD_S)

    assert result == HandlerResult("cancelled")
    assert time.monotonic() - began < 2.0
    assert ("stdout", "terminated") in sink.lines
    assert await group_gone(read_pid(pidfile))


@pytest.mark.anyio
async def test_cancelling_a_command_that_ignores_sigterm_kills_it_after_the_grace(
    tmp_path: Path,
) -> None:
    """SIGTERM ignored: SIGKILL after grace_s, and the whole process group is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; trap '' TERM; echo ready; sleep 30"
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=0.5)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    pgid = read_pid(pidfile)
    assert len(live_group_members(pgid)) == 2  # sh and its sleep
    began = time.monotonic()

    context.cancelled.set()
    result = await asyncio.wait_for(work, HANG_GUARD_S)

    assert result == HandlerResult("cancelled")
    assert 0.45 <= time.monotonic() - began < 3.0
    assert await group_gone(pgid)


@pytest.mark.anyio
async def test_run_stopping_a_command_attempt_kills_its_process_group(tmp_path: Path) -> None:
    """The handler task cancelled (self-fencing, shutdown): the group is stopped, then it
    re-raises the cancellation."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; echo ready; sleep 30"
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=0.5)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")

    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(work, HANG_GUARD_S)

    assert await group_gone(read_pid(pidfile))


@pytest.mark.anyio
@pytest.mark.parametrize("stop_by", ["timeout", "cancel"])
async def test_a_background_child_holding_the_output_does_not_outlive_the_attempt(
    tmp_path: Path, stop_by: str
) -> None:
    """The leader exits at once but leaves a child holding stdout: a timeout or a cancel still
    ends the attempt within its grace, and the child (same process group) is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; sleep 3 & echo ready"
    payload: dict[str, Any] = {"argv": ["sh", "-c", script]}
    if stop_by == "timeout":
        payload["timeout_s"] = 0.3
    sink = Sink()
    context = job_context("command", payload, sink, grace_s=0.5)
    began = time.monotonic()
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    pgid = read_pid(pidfile)
    try:
        if stop_by == "cancel":
            context.cancelled.set()
        await asyncio.wait_for(work, HANG_GUARD_S)
        ended_after_s = time.monotonic() - began

        assert ended_after_s < 2.0, f"the attempt lasted {ended_after_s:.1f} s"
        assert await group_gone(pgid, within_s=0.5), "the background child still runs"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.anyio
@pytest.mark.parametrize("program", ["missing", "not-executable"])
async def test_command_that_cannot_start_fails_exec_failed(tmp_path: Path, program: str) -> None:
    """A missing or non-executable program: failed, code exec_failed, not retryable."""
    path = tmp_path / program
    if program == "not-executable":
        path.write_text("#!/bin/sh\necho hi\n")
        path.chmod(0o644)
    context = job_context("command", {"argv": [str(path)]})

    result = await finished(CommandHandler(), context)

    assert (result.outcome, result.retryable) == ("failed", False)
    assert result.error is not None
    assert result.error["code"] == "exec_failed"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "payload",
    [
        None,
        {},
        {"argv": []},
        {"argv": "echo hi"},
        {"argv": ["echo", 1]},
        {"argv": ["true"], "timeout_s": 0},
        {"argv": ["true"], "timeout_s": -1},
        {"argv": ["true"], "timeout_s": True},
        {"argv": ["true"], "timeout_s": "5"},
        {"argv": ["true"], "timeout_s": 7 * 24 * 3600 + 1},
    ],
    ids=repr,
)
async def test_command_with_a_bad_payload_fails_bad_payload(payload: Any) -> None:
    """Malformed argv or timeout_s: failed, code bad_payload, not retryable."""
    result = await finished(CommandHandler(), job_context("command", payload))

    assert (result.outcome, result.retryable, result.error and result.error["code"]) == (
        "failed",
        False,
        "bad_payload",
    )


@pytest.mark.anyio
async def test_command_hands_its_artifacts_to_upload_after_success(tmp_path: Path) -> None:
    """payload artifacts [{"path", "name"}] go to upload(file, name), opened, once the command
    succeeded."""
    produced = tmp_path / "report.txt"
    payload = {
        "argv": ["sh", "-c", f"echo done > {produced}"],
        "artifacts": [{"path": str(produced), "name": "report.txt"}],
    }
    sink = Sink()

    result = await finished(CommandHandler(), job_context("command", payload, sink))

    assert result.outcome == "succeeded"
    ((source, name),) = sink.uploads
    with source:
        assert (source.read(), name) == (b"done\n", "report.txt")
    assert produced.read_text() == "done\n"


@pytest.mark.anyio
async def test_a_failed_command_uploads_nothing(tmp_path: Path) -> None:
    """Artifacts are uploaded after success only."""
    payload = {
        "argv": ["sh", "-c", "exit 1"],
        "artifacts": [{"path": str(tmp_path / "out"), "name": "out"}],
    }
    sink = Sink()

    await finished(CommandHandler(), job_context("command", payload, sink))

    assert sink.uploads == []


LONG_LINE_SCRIPT = 'head -c 3000000 /dev/zero | tr "\\0" A; echo; echo done'


def unsplit(pieces: list[str]) -> str:
    """The line that `pieces` were split from: continuation pieces lose their mark."""
    return "".join(piece.removeprefix(CONTINUED) for piece in pieces)


@pytest.mark.anyio
async def test_a_line_longer_than_the_bound_arrives_in_marked_pieces() -> None:
    """A 3 MB line: the command succeeds, the line arrives in pieces of at most the bound,
    each after the first marked as a continuation, and the next line follows intact."""
    sink = Sink()

    result = await finished(
        CommandHandler(), job_context("command", {"argv": ["sh", "-c", LONG_LINE_SCRIPT]}, sink)
    )

    assert result == HandlerResult("succeeded", output={"exit_code": 0})
    *pieces, last = sink.stream("stdout")
    assert last == "done"
    assert len(pieces) > 1
    assert all(len(piece.encode()) <= LINE_BYTES for piece in pieces)
    assert [piece.startswith(CONTINUED) for piece in pieces] == [False] + [True] * (len(pieces) - 1)
    assert unsplit(pieces) == "A" * 3_000_000


@pytest.mark.anyio
async def test_a_long_line_is_split_between_utf8_characters_never_inside_one() -> None:
    """Two-byte characters over several pieces: no piece holds a broken character."""
    line = "\u00e9" * 30_000
    sink = Sink()

    result = await finished(
        CommandHandler(), job_context("command", {"argv": ["printf", "%s\\n", line]}, sink)
    )

    assert result.outcome == "succeeded"
    pieces = sink.stream("stdout")
    assert len(pieces) > 1
    assert "\ufffd" not in "".join(pieces)
    assert unsplit(pieces) == line


@pytest.mark.anyio
async def test_a_failing_output_reader_fails_the_attempt_and_stops_the_command(
    tmp_path: Path,
) -> None:
    """The reader of stdout fails on a line: the attempt fails at once with code
    output_unreadable (naming the stream), and the command's process group is gone, rather
    than the command blocking on a pipe nobody drains."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; echo first; exec yes"

    def broken_log(stream: str, text: str) -> None:
        raise RuntimeError("the log buffer broke")

    context = job_context("command", {"argv": ["sh", "-c", script]}, grace_s=0.5)
    context.log_line = broken_log

    result = await finished(CommandHandler(), context)

    assert (result.outcome, result.retryable) == ("failed", True)
    assert result.error == {
        "code": "output_unreadable",
        "message": "reading the command's stdout failed (RuntimeError); the command was stopped",
    }
    assert await group_gone(read_pid(pidfile))


# -- handler loading ----------------------------------------------------------------------------


class EchoHandler:
    resumable = True

    async def run(self, context: JobContext) -> HandlerResult:
        return HandlerResult("succeeded", output=context.payload)


@dataclass
class FakeEntryPoint:
    name: str
    target: Any

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def install_plugins(monkeypatch: pytest.MonkeyPatch, *plugins: FakeEntryPoint) -> list[str]:
    groups: list[str] = []

    def entry_points(*, group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return list(plugins)

    monkeypatch.setattr(handlers_module, "entry_points", entry_points)
    return groups


def test_load_handlers_ships_noop_sleep_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no plugin installed, the three built-in kinds."""
    install_plugins(monkeypatch)

    handlers = load_handlers()

    assert {kind: type(h) for kind, h in handlers.items()} == {
        "noop": NoopHandler,
        "sleep": SleepHandler,
        "command": CommandHandler,
    }
    assert (handlers["noop"].resumable, handlers["sleep"].resumable) == (True, True)
    assert handlers["command"].resumable is False


def test_load_handlers_adds_plugins_from_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `moonrun.handlers` entry point named `echo` handles kind echo (an instance of it)."""
    groups = install_plugins(monkeypatch, FakeEntryPoint("echo", EchoHandler))

    handlers = load_handlers()

    assert groups == [ENTRY_POINT_GROUP]
    assert ENTRY_POINT_GROUP == "moonrun.handlers"
    assert isinstance(handlers["echo"], EchoHandler)
    assert set(handlers) == {"noop", "sleep", "command", "echo"}


def test_a_plugin_may_replace_a_built_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin named like a built-in kind takes its place."""
    install_plugins(monkeypatch, FakeEntryPoint("sleep", EchoHandler))

    assert isinstance(load_handlers()["sleep"], EchoHandler)


def test_a_broken_plugin_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin that fails to load is left out (its kind then fails unknown_kind); Run goes on."""
    install_plugins(
        monkeypatch,
        FakeEntryPoint("broken", ImportError("no module named nowhere")),
        FakeEntryPoint("echo", EchoHandler),
    )

    with caplog.at_level(logging.WARNING, logger="moonrun.run.handlers"):
        handlers = load_handlers()

    assert set(handlers) == {"noop", "sleep", "command", "echo"}
    assert [r.getMessage() for r in caplog.records] == ["handler plugin failed to load"]


def test_the_installed_package_registers_the_built_ins_as_entry_points() -> None:
    """pyproject's moonrun.handlers entry points name the same three classes."""
    handlers = load_handlers()

    assert {kind: type(handlers[kind]) for kind in ("noop", "sleep", "command")} == {
        "noop": NoopHandler,
        "sleep": SleepHandler,
        "command": CommandHandler,
    }


# -- transfers: logs ----------------------------------------------------------------------------

ATTEMPT = Attempt("job_1", 1, LEASE)
OTHER_ATTEMPT = Attempt("job_2", 3, LEASE)


class FakeChannels:
    """The logs and artifacts side of a PlatformClient; raises the queued errors first."""

    def __init__(self) -> None:
        self.session: object | None = object()
        self.errors: list[Exception] = []
        self.log_calls: list[tuple[str, int, int, list[str]]] = []
        self.chunk_calls: list[tuple[str, int, str, int, bytes, bool]] = []
        self.first_seqs: dict[tuple[str, int], int] = {}

    async def send_logs(
        self, job_id: str, attempt: int, lease: str, seq: int, lines: list[dict[str, str]]
    ) -> Any:
        """Records seqs relative to the attempt's first (1, 2, ...): absolute seqs start from
        the wall clock so that a restarted Run never reuses one."""
        assert lease == LEASE
        assert all(set(line) == {"ts", "stream", "text"} for line in lines)
        first = self.first_seqs.setdefault((job_id, attempt), seq)
        self.log_calls.append((job_id, attempt, seq - first + 1, [line["text"] for line in lines]))
        if self.errors:
            raise self.errors.pop(0)
        return {"accepted_through_seq": seq}

    async def put_chunk(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        name: str,
        index: int,
        data: bytes,
        *,
        final: bool,
    ) -> Any:
        self.chunk_calls.append((job_id, attempt, name, index, data, final))
        if self.errors:
            raise self.errors.pop(0)
        return {"chunk_index": index, "final": final}


def shipper(client: Any, **options: Any) -> LogShipper:
    """A shipper whose clock stands still: its seqs count 1, 2, 3... over all attempts."""
    return LogShipper(client, **{"clock_us": lambda: 0, **options})


def add_lines(logs: LogShipper, attempt: Attempt, *texts: str) -> None:
    for text in texts:
        logs.add(attempt, "stdout", text)


@pytest.mark.anyio
async def test_a_full_log_buffer_drops_its_oldest_lines_and_counts_them() -> None:
    """Capacity 3, five lines added: the two oldest are dropped, counted and said in the logs,
    never blocking."""
    client = FakeChannels()
    logs = shipper(client, capacity=3)
    add_lines(logs, ATTEMPT, "l1", "l2", "l3", "l4", "l5")

    await logs.flush()

    assert logs.dropped == 2
    note = "[moonrun: 2 earlier line(s) dropped: output outran log shipping]"
    assert client.log_calls == [("job_1", 1, 1, [note, "l3", "l4", "l5"])]
    assert logs.shipped == 4


@pytest.mark.anyio
async def test_a_loud_attempt_never_pushes_out_a_quiet_attempts_lines() -> None:
    """Buffers full of one attempt's flood: lines go from that attempt, never from another's."""
    client = FakeChannels()
    logs = shipper(client, capacity=10)
    logs.add(OTHER_ATTEMPT, "stdout", "quiet")
    add_lines(logs, ATTEMPT, *[f"loud-{n}" for n in range(100)])

    await logs.flush()

    delivered = {job: texts for job, _, _, texts in client.log_calls}
    assert delivered["job_2"] == ["quiet"]
    assert delivered["job_1"][1:] == [f"loud-{n}" for n in range(91, 100)]
    assert logs.dropped == 91


@pytest.mark.anyio
async def test_every_attempt_gets_a_batch_in_each_flush_however_much_another_has() -> None:
    """An attempt with thousands of lines waiting does not hold back another's one line."""
    client = FakeChannels()
    logs = shipper(client, batch_lines=500)
    add_lines(logs, ATTEMPT, *[f"loud-{n}" for n in range(1_500)])
    logs.add(OTHER_ATTEMPT, "stdout", "quiet")

    await logs.flush()

    sent = [(job, len(texts)) for job, _, _, texts in client.log_calls]
    assert sent == [("job_1", 500), ("job_2", 1)]


@pytest.mark.anyio
async def test_one_attempts_buffer_is_bounded_in_bytes_as_well_as_lines() -> None:
    """Long lines fill an attempt's byte bound before its line bound: the oldest go."""
    client = FakeChannels()
    logs = shipper(client, attempt_capacity_bytes=100_000)
    add_lines(logs, ATTEMPT, *[f"{n:02d}" + "x" * 9_998 for n in range(20)])

    await logs.flush()

    (*_, texts), *_ = client.log_calls
    assert [text[:2] for text in texts[1:]] == [f"{n:02d}" for n in range(11, 20)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [Unreachable(), ChannelBusy(), SessionRotated(), SessionExpired()], ids=repr
)
async def test_a_transient_log_error_keeps_the_lines_in_order(error: MoonrunError) -> None:
    """The platform unreachable (or busy, or a session renewing): lines stay, and go next time."""
    client = FakeChannels()
    client.errors = [error]
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b", "c")

    await logs.flush()
    assert (logs.shipped, logs.dropped) == (0, 0)
    await logs.flush()

    assert [texts for *_, texts in client.log_calls] == [["a", "b", "c"], ["a", "b", "c"]]
    assert (logs.shipped, logs.dropped) == (3, 0)


@pytest.mark.anyio
async def test_a_transient_log_error_keeps_each_attempts_lines_in_order() -> None:
    """Lines of two attempts put back after a failure keep their order per attempt."""
    client = FakeChannels()
    client.errors = [Unreachable(), Unreachable()]
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "a1")
    logs.add(OTHER_ATTEMPT, "stderr", "b1")
    logs.add(ATTEMPT, "stdout", "a2")
    logs.add(OTHER_ATTEMPT, "stderr", "b2")

    await logs.flush()
    await logs.flush()

    delivered = {job: texts for job, _, _, texts in client.log_calls[2:]}
    assert delivered == {"job_1": ["a1", "a2"], "job_2": ["b1", "b2"]}


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [NotActive(), LeaseExpired(), StaleAttempt(), WrongEndpoint()], ids=repr
)
async def test_a_permanent_log_error_drops_the_attempts_lines(error: MoonrunError) -> None:
    """The attempt is over for good: its lines are dropped (counted), not retried forever."""
    client = FakeChannels()
    client.errors = [error]
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b", "c")

    await logs.flush()
    await logs.flush()

    assert len(client.log_calls) == 1
    assert (logs.shipped, logs.dropped) == (0, 3)


@pytest.mark.anyio
async def test_log_batches_stay_below_the_platforms_log_body_limit() -> None:
    """Long lines go in several batches, each well below the 1 MiB the platform accepts, and
    every line is shipped once."""
    client = FakeChannels()
    logs = shipper(client, attempt_capacity_bytes=64 * 1024 * 1024)
    add_lines(logs, ATTEMPT, *[f"{n:03d}" + "\x01" * 20_000 for n in range(100)])

    while logs.shipped < 100 and len(client.log_calls) < 100:
        await logs.flush()

    sizes = [len(json.dumps(texts)) for *_, texts in client.log_calls]
    assert [size for size in sizes if size > 800 * 1024] == []
    shipped = [text[:3] for *_, texts in client.log_calls for text in texts]
    assert shipped == [f"{n:03d}" for n in range(100)]


@pytest.mark.anyio
async def test_log_batch_seqs_increase_per_attempt() -> None:
    """Each attempt's batches have increasing seqs, from one count over every attempt (so
    the shipper keeps nothing per attempt once its lines are sent)."""
    client = FakeChannels()
    logs = shipper(client)

    add_lines(logs, ATTEMPT, "a")
    await logs.flush()
    add_lines(logs, ATTEMPT, "b")
    add_lines(logs, OTHER_ATTEMPT, "x")
    await logs.flush()
    add_lines(logs, ATTEMPT, "c")
    await logs.flush()

    seqs = [(job, seq, texts) for job, _, seq, texts in client.log_calls]
    assert seqs == [
        ("job_1", 1, ["a"]),
        ("job_1", 2, ["b"]),
        ("job_2", 1, ["x"]),
        ("job_1", 4, ["c"]),
    ]
    assert (logs._buffers, logs._pending) == ({}, {})


@pytest.mark.anyio
async def test_a_log_batch_holds_at_most_batch_lines() -> None:
    """batch_lines=2 and five lines: three batches of 2, 2, 1, in order."""
    client = FakeChannels()
    logs = shipper(client, batch_lines=2)
    add_lines(logs, ATTEMPT, "1", "2", "3", "4", "5")

    for _ in range(3):
        await logs.flush()

    assert [(seq, texts) for *_, seq, texts in client.log_calls] == [
        (1, ["1", "2"]),
        (2, ["3", "4"]),
        (3, ["5"]),
    ]


@pytest.mark.anyio
async def test_a_log_batch_of_long_lines_fits_the_platforms_logs_body_limit() -> None:
    """200 lines of 16 KiB (3 MiB): batches stay within the logs channel's body limit, and
    every line goes, in order."""
    client = FakeChannels()
    logs = shipper(client)
    texts = [f"{number:03d}" + "x" * (16 * 1024 - 3) for number in range(200)]
    add_lines(logs, ATTEMPT, *texts)

    for _ in range(len(texts)):
        await logs.flush()

    batches = [batch for *_, batch in client.log_calls]
    limit = HttpSettings().log_body_limit
    assert [len(json.dumps(batch)) < limit for batch in batches] == [True] * len(batches)
    assert [text for batch in batches for text in batch] == texts


@pytest.mark.anyio
async def test_logs_wait_for_a_session() -> None:
    """Before the first registration nothing is sent and nothing is lost."""
    client = FakeChannels()
    client.session = None
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a")

    await logs.flush()
    client.session = object()
    await logs.flush()

    assert [texts for *_, texts in client.log_calls] == [["a"]]


class IdempotentLogs(FakeChannels):
    """Stores batches like the platform (once per attempt and seq, later repeats ignored); the
    first answer is lost on the way back, as when a response times out."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[tuple[str, int], dict[int, list[str]]] = {}
        self.lose_answers = 1

    async def send_logs(
        self, job_id: str, attempt: int, lease: str, seq: int, lines: list[dict[str, str]]
    ) -> Any:
        batches = self.stored.setdefault((job_id, attempt), {})
        batches.setdefault(seq, [line["text"] for line in lines])
        if self.lose_answers:
            self.lose_answers -= 1
            raise Unreachable("logs: TimeoutError")
        return {"accepted_through_seq": max(batches)}

    def lines_of(self, job_id: str, attempt: int) -> list[str]:
        batches = self.stored.get((job_id, attempt), {})
        return [text for seq in sorted(batches) for text in batches[seq]]


@pytest.mark.anyio
async def test_log_lines_survive_a_lost_answer_to_a_delivered_batch() -> None:
    """A batch stored but answered with a timeout is retried; lines added meanwhile still land.

    The platform keeps the first batch per (job, attempt, seq) and answers repeats as before
    (docs/protocol.md, "Sending logs"), so a retry under the same seq must carry the same lines.
    """
    client = IdempotentLogs()
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b")
    await logs.flush()  # stored by the platform, but Run sees Unreachable

    add_lines(logs, ATTEMPT, "c")
    await logs.flush()
    await logs.flush()

    assert client.lines_of("job_1", 1) == ["a", "b", "c"]


# -- transfers: artifacts -------------------------------------------------------------------


def test_adding_an_artifact_never_blocks_and_drops_beyond_the_queue() -> None:
    """queue_size=2 and three files: the third is dropped and counted at once."""
    uploader = ArtifactUploader(FakeChannels(), queue_size=2)

    for name in ("a", "b", "c"):
        uploader.add(ATTEMPT, f"/tmp/{name}", name)

    assert uploader.dropped == 1


async def run_uploader(uploader: ArtifactUploader, done: Callable[[], bool]) -> None:
    """Run the uploader until `done()`, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(uploader.run(stop))
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < deadline, "the uploader did not finish"
        assert not task.done(), "the uploader stopped on its own"
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD_S)


@pytest.mark.anyio
async def test_a_large_artifact_uploads_in_ordered_chunks_final_last(tmp_path: Path) -> None:
    """A file of two chunks and a bit: chunks 0, 1, 2 in order, final only on the last."""
    data = os.urandom(2 * CHUNK_BYTES + 10)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    client = FakeChannels()
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "big.bin")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped > 0)

    assert [
        (job, attempt, name, index, final)
        for job, attempt, name, index, _, final in client.chunk_calls
    ] == [
        ("job_1", 1, "big.bin", 0, False),
        ("job_1", 1, "big.bin", 1, False),
        ("job_1", 1, "big.bin", 2, True),
    ]
    assert [len(call[4]) for call in client.chunk_calls] == [CHUNK_BYTES, CHUNK_BYTES, 10]
    assert b"".join(call[4] for call in client.chunk_calls) == data
    assert (uploader.uploaded, uploader.dropped) == (1, 0)


@pytest.mark.anyio
async def test_an_empty_artifact_is_one_final_chunk(tmp_path: Path) -> None:
    """An empty file still arrives: one empty chunk 0 marked final."""
    path = tmp_path / "empty"
    path.write_bytes(b"")
    client = FakeChannels()
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "empty")
    await run_uploader(uploader, lambda: uploader.uploaded > 0)

    assert [call[3:] for call in client.chunk_calls] == [(0, b"", True)]


@pytest.mark.anyio
async def test_an_artifact_chunk_is_retried_after_a_transient_error(tmp_path: Path) -> None:
    """Unreachable on a chunk: the same chunk is sent again, and the upload completes."""
    path = tmp_path / "small"
    path.write_bytes(b"hello")
    client = FakeChannels()
    client.errors = [Unreachable()]
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "small")
    await run_uploader(uploader, lambda: uploader.uploaded > 0)

    assert [call[3:] for call in client.chunk_calls] == [(0, b"hello", True), (0, b"hello", True)]


@pytest.mark.anyio
async def test_an_artifact_refused_for_good_or_unreadable_is_dropped(tmp_path: Path) -> None:
    """not_active for a chunk, or a file that cannot be read: dropped and counted; Run goes on."""
    path = tmp_path / "small"
    path.write_bytes(b"hello")
    client = FakeChannels()
    client.errors = [NotActive()]
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "refused")
    uploader.add(ATTEMPT, str(tmp_path / "missing"), "missing")
    uploader.add(ATTEMPT, str(path), "fine")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped == 3)

    assert (uploader.uploaded, uploader.dropped) == (1, 2)
    assert [call[2] for call in client.chunk_calls] == ["refused", "fine"]


@pytest.mark.anyio
async def test_an_artifact_whose_name_the_platform_refuses_says_so_in_its_jobs_logs(
    tmp_path: Path,
) -> None:
    """A name the platform refuses (422: a Run whose payload was never checked at submit):
    the artifact is dropped with a line in its job's stderr log saying why, not silently."""
    path = tmp_path / "out"
    path.write_bytes(b"hello")
    client = FakeChannels()
    client.errors = [InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    said: list[tuple[Attempt, str, str]] = []
    uploader = ArtifactUploader(client, job_log=lambda *line: said.append(line))

    uploader.add(ATTEMPT, str(path), "../evil")
    await run_uploader(uploader, lambda: uploader.dropped == 1)

    assert said == [
        (
            ATTEMPT,
            "stderr",
            "artifact ../evil not uploaded: artifact name must match "
            "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        )
    ]


# -- client: error answers ------------------------------------------------------------------

PROTOCOL_ERRORS: list[tuple[int, str, type[MoonrunError]]] = [
    (422, "invalid_request", InvalidRequest),
    (413, "too_large", TooLarge),
    (401, "unauthenticated", Unauthenticated),
    (403, "forbidden", Forbidden),
    (404, "not_found", NotFound),
    (401, "join_token_invalid", JoinTokenInvalid),
    (401, "signature_missing", SignatureMissing),
    (401, "signature_invalid", SignatureInvalid),
    (401, "signature_expired", SignatureExpired),
    (401, "replayed", Replayed),
    (401, "session_rotated", SessionRotated),
    (401, "session_expired", SessionExpired),
    (404, "job_not_found", JobNotFound),
    (403, "wrong_endpoint", WrongEndpoint),
    (409, "stale_attempt", StaleAttempt),
    (409, "lease_mismatch", LeaseMismatch),
    (409, "reconcile_required", ReconcileRequired),
    (409, "ack_deadline_expired", AckDeadlineExpired),
    (409, "lease_expired", LeaseExpired),
    (409, "not_active", NotActive),
    (409, "no_cancel_intent", NoCancelIntent),
    (409, "sequence_regression", SequenceRegression),
    (409, "terminal_conflict", TerminalConflict),
    (429, "channel_busy", ChannelBusy),
    (409, "already_exists", AlreadyExists),
    (409, "idempotency_conflict", IdempotencyConflict),
    (409, "artifact_conflict", ArtifactConflict),
]


@pytest.mark.parametrize(("status", "code", "error_type"), PROTOCOL_ERRORS, ids=lambda v: str(v))
def test_an_error_answer_becomes_the_type_its_code_names(
    status: int, code: str, error_type: type[MoonrunError]
) -> None:
    """Each wire error code maps to its moonrun.errors type, message kept."""
    error = error_from(status, {"error": {"code": code, "message": "said the platform"}})

    assert (type(error), error.message, error.code) == (error_type, "said the platform", code)


def test_an_error_answer_without_a_message_carries_its_code() -> None:
    """No message in the body: the code stands in for it."""
    error = error_from(409, {"error": {"code": "lease_expired"}})

    assert (type(error), error.message) == (LeaseExpired, "lease_expired")


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, {"error": {"code": "internal", "message": "bug"}}),
        (502, None),
        (503, {"error": {"code": "store_unavailable", "message": "down"}}),
        (503, {"error": {"code": "contention", "message": "busy"}}),
        (504, "<html>gateway timeout</html>"),
        (404, None),
        (400, {"detail": "not moonrun's error shape"}),
        (409, {"error": "flat string"}),
    ],
    ids=repr,
)
def test_server_errors_and_unknown_bodies_are_unreachable(status: int, body: Any) -> None:
    """5xx (whatever its code) and bodies without an error code: Unreachable, a transient."""
    error = error_from(status, body)

    assert type(error) is Unreachable
    assert isinstance(error, TRANSIENT)
    assert str(status) in error.message


def test_an_unknown_error_code_is_a_plain_permanent_error() -> None:
    """A 4xx code this Run does not know: a MoonrunError that is neither transient nor session."""
    error = error_from(409, {"error": {"code": "from_the_future", "message": "new"}})

    assert type(error) is MoonrunError
    assert not isinstance(error, TRANSIENT + SESSION_ERRORS)


def test_session_answers_and_transient_answers_are_classified() -> None:
    """session_*, reconcile_required and signature_invalid mean re-register; busy, expired
    signatures, replays and no answer mean try again."""
    session = {
        type(error_from(s, {"error": {"code": c}}))
        for s, c in [
            (401, "session_rotated"),
            (401, "session_expired"),
            (409, "reconcile_required"),
            (401, "signature_invalid"),
        ]
    }
    transient = {
        type(error_from(s, {"error": {"code": c}}))
        for s, c in [
            (429, "channel_busy"),
            (401, "signature_expired"),
            (401, "replayed"),
            (503, "contention"),
        ]
    }

    assert session == set(SESSION_ERRORS)
    assert transient <= set(TRANSIENT)
    assert not any(issubclass(t, SESSION_ERRORS) for t in (NotActive, LeaseExpired, StaleAttempt))


@pytest.mark.anyio
async def test_a_restarted_log_shipper_never_reuses_a_seq() -> None:
    """Seqs start from the wall clock, so Run's successor sends above what was sent before."""
    sent: list[int] = []

    class Recorder(FakeChannels):
        async def send_logs(
            self, job_id: str, attempt: int, lease: str, seq: int, lines: Any
        ) -> Any:
            sent.append(seq)
            return {"accepted_through_seq": seq}

    for started in (T0_MS * 1000, T0_MS * 1000 + 2_000_000):  # two Runs, 2 s apart, one attempt
        shipper = LogShipper(Recorder(), clock_us=lambda started=started: started)  # type: ignore[arg-type]
        for n in range(3):
            shipper.add(ATTEMPT, "stdout", f"line {n}")
            await shipper.flush()
    assert sorted(sent) == sent
    assert len(set(sent)) == len(sent)


def test_a_process_group_left_behind_is_stopped_only_if_it_is_still_the_same() -> None:
    """A journaled group is killed after a Run restart; a recycled pid's group is left alone."""
    from moonrun.run.leftovers import process_record, stop_left_behind

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


def test_a_second_run_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """Two Runs on one journal would corrupt it: the second stops with one clear line."""
    identity.join_key(tmp_path)
    identity.save_endpoint(tmp_path, "ep_1", "http://127.0.0.1:9")
    command = [
        sys.executable,
        "-m",
        "moonrun",
        "run",
        "start",
        "--platform",
        "http://127.0.0.1:9",
        "--data-dir",
        str(tmp_path),
    ]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (tmp_path / identity.LOCK_FILE).exists():
            time.sleep(0.05)
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert (1, [f"moonrun: error: another Run is already using {tmp_path}"]) == (
        second.returncode,
        second.stderr.splitlines(),
    )


@hypothesis.given(st.text())
def test_a_log_lines_size_is_the_length_of_its_json(text: str) -> None:
    """What the shipper counts for a line's text is exactly what JSON makes of it."""
    assert transfers._json_len(text) == len(json.dumps(text))
