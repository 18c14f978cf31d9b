"""The `command` handler, run directly with a `JobContext` (tests/support/run_kit.py): output
lines, exit codes, artifacts, a process group stopped, bad payloads. It starts real processes
(tiny shell scripts); the tests that time its timeout, cancel and grace on the real clock are
tests/process/test_command_handler.py's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from moonrun.run.handlers.command import CONTINUED, LINE_BYTES, CommandHandler
from tests.support.run_kit import (
    HANG_GUARD_S,
    Sink,
    finished,
    group_gone,
    job_context,
    read_pid,
    wait_for_line,
)

# -- command ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_command_succeeds_with_its_output_lines_in_order_per_stream() -> None:
    """stdout and stderr arrive line by line, each stream in order; output is the exit code."""
    script = "echo one; echo uno >&2; echo two; echo dos >&2; printf 'three'"
    sink = Sink()

    result = await finished(
        CommandHandler(), job_context("command", {"argv": ["sh", "-c", script]}, sink)
    )

    assert (result.outcome, result.error, result.output["exit_code"]) == ("succeeded", None, 0)
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

    assert (result.outcome, result.error, result.output["exit_code"]) == ("succeeded", None, 0)
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
