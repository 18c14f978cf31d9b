"""`command` `{"argv": [...], "timeout_s"?, "artifacts"?: [{"path", "name"}]}`.

Runs argv without a shell, in its own process group (journaled); stdout and stderr go line by
line to the logs channel. Cancel sends SIGTERM, then SIGKILL after the grace. Not resumable: a
restarted Run cannot take over its predecessor's process, so it stops that process group and
reports the confirmed attempt `run_restarted` (retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from moonrun.run.handlers import HandlerResult, JobContext

MAX_TIMEOUT_S = 7 * 24 * 3600


class CommandHandler:
    resumable = False

    async def run(self, context: JobContext) -> HandlerResult:
        payload = context.payload if isinstance(context.payload, dict) else {}
        argv = payload.get("argv")
        timeout_s = payload.get("timeout_s", MAX_TIMEOUT_S)
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(part, str) for part in argv)
            or isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not 0 < timeout_s <= MAX_TIMEOUT_S
        ):
            return HandlerResult.failed(
                "bad_payload", "command needs argv (a list of strings) and an optional timeout_s"
            )
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            return HandlerResult.failed("exec_failed", f"cannot start {argv[0]}: {error.strerror}")
        await context.remember_process(process.pid)
        readers = [
            asyncio.create_task(_pump(process.stdout, "stdout", context)),
            asyncio.create_task(_pump(process.stderr, "stderr", context)),
        ]
        waiter = asyncio.create_task(process.wait())
        cancelled = asyncio.create_task(context.cancelled.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, cancelled}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter not in done:
                await _stop(process, context.grace_s)
                await asyncio.gather(*readers, return_exceptions=True)
                if cancelled in done:
                    return HandlerResult("cancelled")
                return HandlerResult.failed(
                    "timeout", f"killed after {timeout_s} s", retryable=True
                )
        except asyncio.CancelledError:  # Run itself stops the attempt (self-fencing, shutdown)
            await _stop(process, context.grace_s)
            raise
        finally:
            cancelled.cancel()
        await _stop(process, context.grace_s)  # the attempt ends with its leader: no leftovers
        await asyncio.gather(*readers, return_exceptions=True)
        code = waiter.result()
        if code != 0:
            return HandlerResult.failed("exit_status", f"{argv[0]} exited with status {code}")
        for artifact in payload.get("artifacts") or []:
            if isinstance(artifact, dict):
                context.upload(str(artifact.get("path", "")), str(artifact.get("name", "")))
        return HandlerResult("succeeded", output={"exit_code": 0})


async def _pump(stream: asyncio.StreamReader | None, name: str, context: JobContext) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        context.log(name, line.decode("utf-8", "replace").rstrip("\n"))


async def _stop(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the whole process group, then SIGKILL it after the grace.

    The group is signalled even when its leader has exited: a child it left behind (holding
    stdout, say) must not outlive the attempt.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + grace_s
    await _until_gone(process, deadline)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def _until_gone(process: asyncio.subprocess.Process, deadline: float) -> None:
    """Wait until the leader has exited and no member of its group is left, or `deadline`."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        if process.returncode is not None and not _group_alive(process.pid):
            return
        await asyncio.sleep(0.05)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_record(pid: int) -> dict[str, int]:
    """What identifies a process group leader beyond its (reusable) pid."""
    return {"pgid": pid, "started": _start_ticks(pid) or 0}


def stop_left_behind(record: dict[str, int], grace_s: float) -> None:
    """Stop a process group a previous Run process started, if it still runs (blocking).

    A pid cannot be reused while a process group of that id has members; a leader found
    with another start time means the old group is gone and the pid belongs to someone else.
    """
    pgid = record.get("pgid", 0)
    if pgid <= 1 or not _group_alive(pgid):
        return
    started = _start_ticks(pgid)
    if started is not None and started != record.get("started"):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else None
