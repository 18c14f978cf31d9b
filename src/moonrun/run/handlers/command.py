"""`command` `{"argv": [...], "timeout_s"?, "artifacts"?: [{"path", "name"}]}`.

Runs argv without a shell, in its own process group; stdout and stderr go line by line to the
logs channel. Cancel sends SIGTERM, then SIGKILL after the grace. Not resumable: a process
that died with Run cannot be picked up again, so a confirmed attempt is reported
`run_restarted` (retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

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
    """SIGTERM the process group, then SIGKILL it after the grace."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
