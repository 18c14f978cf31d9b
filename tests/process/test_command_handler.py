"""The `command` handler's timeout, cancel and grace on the real clock: a command over its
timeout is killed, a cancel sends SIGTERM first and SIGKILL after the grace, and a background
child holding the output does not outlive the attempt. Real processes whose waits are timed,
with generous bounds: the real-process lane of `make test` (docs/testing.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from moonrun.run.handlers.command import CommandHandler
from tests.support.run_kit import (
    HANG_GUARD_S,
    Sink,
    finished,
    group_gone,
    job_context,
    live_group_members,
    read_pid,
    wait_for_line,
)

pytestmark = [pytest.mark.processes, pytest.mark.alone]

BOUND_S = 15.0
"""Generous: each bound below stands far below what the wrong behaviour would take (a
command that sleeps 60 s, a grace of 60 s), and far above what the right one takes (well under
a second on an idle machine)."""


@pytest.mark.anyio
async def test_command_over_its_timeout_fails_retryable_and_is_killed(tmp_path: Path) -> None:
    """timeout_s passed: failed, code timeout, retryable; the process group is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; sleep 60"
    context = job_context("command", {"argv": ["sh", "-c", script], "timeout_s": 0.3}, grace_s=0.5)
    began = time.monotonic()

    result = await finished(CommandHandler(), context)

    assert (result.outcome, result.retryable) == ("failed", True)
    assert result.error is not None
    assert result.error["code"] == "timeout"
    assert 0.25 <= time.monotonic() - began < BOUND_S
    assert await group_gone(read_pid(pidfile))


@pytest.mark.anyio
async def test_cancelling_a_command_sends_sigterm_first(tmp_path: Path) -> None:
    """A command that handles SIGTERM exits on it, well within the grace: outcome cancelled."""
    pidfile = tmp_path / "pid"
    script = (
        f"echo $$ > {pidfile}; trap 'echo terminated; exit 143' TERM; echo ready; sleep 60 & wait"
    )
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=60.0)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    began = time.monotonic()

    context.cancelled.set()
    result = await asyncio.wait_for(work, HANG_GUARD_S)

    assert (result.outcome, result.error) == ("cancelled", None)
    assert time.monotonic() - began < BOUND_S
    assert ("stdout", "terminated") in sink.lines
    assert await group_gone(read_pid(pidfile))


@pytest.mark.anyio
async def test_a_child_that_missed_the_groups_sigterm_gets_its_own_once_the_command_exits(
    tmp_path: Path,
) -> None:
    """The child lets the group's SIGTERM go by (as a shell's child between its fork and its
    exec does, by chance): once the command has exited, it gets one of its own, and the
    cancel ends well within the grace instead of at its end."""
    pidfile = tmp_path / "pid"
    script = (
        f"echo $$ > {pidfile}; trap 'exit 143' TERM; "
        "(trap 'trap - TERM' TERM; while :; do sleep 0.1; done) & echo ready; wait"
    )
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=60.0)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    pgid = read_pid(pidfile)
    began = time.monotonic()
    try:
        context.cancelled.set()
        result = await asyncio.wait_for(work, HANG_GUARD_S)

        assert (result.outcome, result.error) == ("cancelled", None)
        assert time.monotonic() - began < BOUND_S
        assert await group_gone(pgid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.anyio
async def test_cancelling_a_command_that_ignores_sigterm_kills_it_after_the_grace(
    tmp_path: Path,
) -> None:
    """SIGTERM ignored: SIGKILL after grace_s, and the whole process group is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; trap '' TERM; echo ready; sleep 60"
    sink = Sink()
    context = job_context("command", {"argv": ["sh", "-c", script]}, sink, grace_s=0.5)
    work = asyncio.create_task(CommandHandler().run(context))
    await wait_for_line(sink, "ready")
    pgid = read_pid(pidfile)
    assert len(live_group_members(pgid)) == 2  # sh and its sleep
    began = time.monotonic()

    context.cancelled.set()
    result = await asyncio.wait_for(work, HANG_GUARD_S)

    assert (result.outcome, result.error) == ("cancelled", None)
    assert 0.45 <= time.monotonic() - began < BOUND_S
    assert await group_gone(pgid)


@pytest.mark.anyio
@pytest.mark.parametrize("stop_by", ["timeout", "cancel"])
async def test_a_background_child_holding_the_output_does_not_outlive_the_attempt(
    tmp_path: Path, stop_by: str
) -> None:
    """The leader exits at once but leaves a child holding stdout: a timeout or a cancel still
    ends the attempt within its grace, and the child (same process group) is gone."""
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; sleep 60 & echo ready"
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

        assert ended_after_s < BOUND_S, f"the attempt lasted {ended_after_s:.1f} s"
        assert await group_gone(pgid, within_s=BOUND_S), "the background child still runs"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
