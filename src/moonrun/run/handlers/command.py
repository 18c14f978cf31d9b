"""`command` `{"argv": [...], "timeout_s"?, "artifacts"?: [{"path", "name"}]}`.

Runs argv without a shell, in its own process group (journaled), under Run's `Confinement`
(user, allow-listed environment, a working directory of its own per attempt, removed when the
attempt ends). stdout and stderr go line by line to the logs channel, read in chunks so that
the pipes are always drained: a line longer than LINE_BYTES arrives in pieces, each after the
first starting with CONTINUED. A reader that fails stops the command and fails the attempt
(`output_unreadable`). Cancel sends SIGTERM, then SIGKILL after the grace. Not resumable: a
restarted Run cannot take over its predecessor's process, so it stops that process group and
reports the confirmed attempt `run_restarted` (retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from moonrun.run.confinement import Confinement, remove_workdir
from moonrun.run.handlers import HandlerResult, JobContext, refuse_payload
from moonrun.scheduling.kinds import compile_schema

log = logging.getLogger("moonrun.run.handlers.command")

MAX_TIMEOUT_S = 7 * 24 * 3600
READ_BYTES = 64 * 1024
LINE_BYTES = 16 * 1024
"""The most bytes a log line of a command may have: longer lines arrive in pieces (never
longer than what the log shipper keeps of a line)."""
CONTINUED = "[continued] "
"""What starts every piece of a split line but its first."""
PIECE_BYTES = LINE_BYTES - len(CONTINUED.encode())
"""The most bytes of output in one log line, leaving room for the mark."""


PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["argv"],
    "properties": {
        "argv": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string"},
            "description": "The program and its arguments, run without a shell.",
        },
        "timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_TIMEOUT_S,
            "description": "Stop the command after this many seconds (a retryable failure).",
        },
        "artifacts": {
            "type": "array",
            "description": "Files the command leaves in its working directory, uploaded after "
            "it succeeds.",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "name"],
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "name": {"type": "string", "minLength": 1, "maxLength": 128},
                },
            },
        },
    },
}


CHECK_PAYLOAD = compile_schema(PAYLOAD_SCHEMA)


class CommandHandler:
    resumable = False
    payload_schema = PAYLOAD_SCHEMA

    def __init__(self, confinement: Confinement | None = None) -> None:
        self.confinement = confinement or Confinement()

    async def run(self, context: JobContext) -> HandlerResult:
        if refused := refuse_payload(CHECK_PAYLOAD, context.payload):
            return refused
        payload = context.payload
        argv = payload["argv"]
        timeout_s = payload.get("timeout_s", MAX_TIMEOUT_S)
        workdir = await asyncio.to_thread(
            self.confinement.make_workdir, context.job_id, context.attempt
        )
        try:
            return await self._run(context, payload, argv, timeout_s, workdir)
        finally:
            await asyncio.to_thread(remove_workdir, workdir)

    async def _run(
        self,
        context: JobContext,
        payload: dict[str, Any],
        argv: list[str],
        timeout_s: float,
        workdir: Path,
    ) -> HandlerResult:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                cwd=workdir,
                **self.confinement.spawn_options(),
            )
        except OSError as error:
            return HandlerResult.failed("exec_failed", f"cannot start {argv[0]}: {error.strerror}")
        await context.remember_process(process.pid)
        streams = {"stdout": process.stdout, "stderr": process.stderr}
        readers = {
            name: asyncio.create_task(_pump(stream, name, context))
            for name, stream in streams.items()
        }
        waiter = asyncio.create_task(process.wait())
        cancelled = asyncio.create_task(context.cancelled.wait())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        watched: set[asyncio.Task[Any]] = {waiter, cancelled, *readers.values()}
        try:
            while True:
                done, watched = await asyncio.wait(
                    watched,
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done or waiter in done or cancelled in done or _broken(readers):
                    break
            if waiter not in done or _broken(readers):
                await _stop(process, context.grace_s)
                await _finish_reading(streams, readers)
                if broken := _broken(readers):
                    return _unreadable(context, broken, readers[broken])
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
        await _finish_reading(streams, readers)
        if broken := _broken(readers):
            return _unreadable(context, broken, readers[broken])
        code = waiter.result()
        if code != 0:
            return HandlerResult.failed("exit_status", f"{argv[0]} exited with status {code}")
        for artifact in payload.get("artifacts", []):
            await self._upload(context, workdir, artifact)
        return HandlerResult("succeeded", output={"exit_code": 0})

    async def _upload(self, context: JobContext, workdir: Path, artifact: dict[str, Any]) -> None:
        """Open an artifact now, while the working directory still exists, and hand the open
        file to the uploader; one that may not be uploaded gets a line in the job's logs."""
        path, name = str(artifact.get("path", "")), str(artifact.get("name", ""))
        opened = await asyncio.to_thread(self.confinement.open_artifact, workdir, path)
        if isinstance(opened, str):
            context.log("stderr", f"artifact {name} not uploaded: {opened}")
            fields = {"job_id": context.job_id, "artifact": name, "why": opened}
            log.warning("artifact not uploaded", extra={"fields": fields})
            return
        context.upload(opened, name)


def _broken(readers: dict[str, asyncio.Task[None]]) -> str | None:
    """The stream whose reader failed, if one did."""
    for name, reader in readers.items():
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            return name
    return None


def _unreadable(context: JobContext, name: str, reader: asyncio.Task[None]) -> HandlerResult:
    error = type(reader.exception()).__name__
    log.warning(
        "command output unreadable; the command was stopped",
        extra={"fields": {"job_id": context.job_id, "stream": name, "error": error}},
    )
    return HandlerResult.failed(
        "output_unreadable",
        f"reading the command's {name} failed ({error}); the command was stopped",
        retryable=True,
    )


async def _finish_reading(
    streams: dict[str, asyncio.StreamReader | None], readers: dict[str, asyncio.Task[None]]
) -> None:
    """Wait for the readers; drain the stream of one that failed, so that its pipe closes."""
    await asyncio.gather(*readers.values(), return_exceptions=True)
    for name, reader in readers.items():
        stream = streams[name]
        if stream is not None and not reader.cancelled() and reader.exception() is not None:
            with contextlib.suppress(Exception):
                while await stream.read(READ_BYTES):
                    pass


async def _pump(stream: asyncio.StreamReader | None, name: str, context: JobContext) -> None:
    """Hand the stream's lines to the logs, reading in chunks until the end: a child never
    blocks on a full pipe, however long its lines."""
    if stream is None:
        return
    pending = b""
    continued = False
    while chunk := await stream.read(READ_BYTES):
        pending += chunk
        start = 0
        while True:
            end = pending.find(b"\n", start, start + PIECE_BYTES + 1)
            if end >= 0:
                _log_piece(context, name, pending[start:end], continued)
                start, continued = end + 1, False
            elif len(pending) - start > PIECE_BYTES:
                end = _piece_end(pending, start)
                _log_piece(context, name, pending[start:end], continued)
                start, continued = end, True
            else:
                break
        pending = pending[start:]
    if pending:
        _log_piece(context, name, pending, continued)


def _piece_end(data: bytes, start: int) -> int:
    """Where a piece of at most PIECE_BYTES starting at `start` ends: before a UTF-8
    character, never inside one (unless the bytes are not UTF-8 at all)."""
    end = start + PIECE_BYTES
    for cut in range(end, end - 4, -1):
        if data[cut] & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            return cut
    return end


def _log_piece(context: JobContext, name: str, piece: bytes, continued: bool) -> None:
    text = piece.decode("utf-8", "replace")
    context.log(name, CONTINUED + text if continued else text)


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
