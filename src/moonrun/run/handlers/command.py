"""`command` `{"argv": [...], "timeout_s"?, "artifacts"?: [{"path", "name"}]}`.

Runs argv without a shell under Run's `Confinement` (its user, per owner with
`--run-as-range`; an allow-listed environment; a working directory of its own per attempt
under Run's work root, removed when the attempt ends), through a supervisor process of its
own (run/supervisor.py) that owns every process the command starts: it joins the attempt's
cgroup when Run made one, is a child subreaper (nothing the command leaves behind escapes to
init), and with namespaces is PID 1 of the attempt. When the main process exits, on cancel
and on timeout, the supervisor stops every descendant (SIGTERM, SIGKILL after the grace) and
reports the main process's status and how many others it stopped; a job that left processes
behind after its main process exited gets a line saying so in its stderr log. Run then kills
whatever is left in the cgroup (`cgroup.kill`), and reads the output pipes only DRAIN_S more:
a process that could not be killed does not hold the attempt's outcome.

Why a supervisor process rather than `preexec_fn` (or Run itself as the subreaper): Run has
threads (journal writes, `asyncio.to_thread`), and Python code run between fork and exec in a
threaded process can deadlock on a lock another thread held at the fork; a subreaper must
reap children it never started, which Run's child watcher (one wait per known pid) does not;
a PID namespace needs a PID 1 that stays for the attempt; and the supervisor runs no code
but the stdlib's between its fork and exec. It costs one Python start (about 30 ms) per
attempt.

stdout and stderr go line by line to the logs channel, read in chunks so that the pipes are
always drained: a line longer than LINE_BYTES arrives in pieces, each after the first
starting with CONTINUED. A reader that fails stops the command and fails the attempt
(`output_unreadable`). Not resumable: a restarted Run cannot take over its predecessor's
processes (the supervisor stops them when Run's control pipe closes; what it could not is
stopped from the journaled record, run/leftovers.py), and reports the confirmed attempt
`run_restarted` (retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from moonrun.run import cgroups, leftovers, supervisor
from moonrun.run.confinement import CommandUser, Confinement
from moonrun.run.handlers import HandlerResult, JobContext, refuse_payload
from moonrun.run.owners import OwnerRangeFull
from moonrun.scheduling.jsonschema_subset import compile_schema

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
ARTIFACT_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""The platform's rule for artifact names (artifacts/protocol.py), refused at submit."""
STOP_MARGIN_S = 5.0
"""How long past the grace Run waits for the supervisor's report before it kills it."""
DRAIN_S = 0.5
"""How long Run still reads the output once the supervisor ended: whatever holds the pipes
then is no part of the attempt any more (a process stuck in the kernel, or one that was
handed the pipe outside the attempt)."""


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
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 128,
                        "pattern": ARTIFACT_NAME_PATTERN,
                        "description": "What the platform stores it as: a letter or digit, "
                        "then letters, digits, '.', '_' or '-'.",
                    },
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
        self._attempts_of: Counter[int] = Counter()
        """Per owner uid (--run-as-range): how many of its attempts run now."""
        self._owner_locks: dict[int, asyncio.Lock] = {}

    async def run(self, context: JobContext) -> HandlerResult:
        if refused := refuse_payload(CHECK_PAYLOAD, context.payload):
            return refused
        payload = context.payload
        confinement = self.confinement
        try:
            user = await asyncio.to_thread(confinement.user_for, context.owner_id)
        except OwnerRangeFull as error:
            log.warning("no uid left for an owner", extra={"fields": {"job_id": context.job_id}})
            return HandlerResult.failed("owner_uids_exhausted", error.message)
        own_uid = user is not None and confinement.owner_ids is not None
        if own_uid:
            assert user is not None
            async with self._owner_lock(user.uid):
                self._attempts_of[user.uid] += 1
        cgroup: Path | None = None
        try:
            workdir = await asyncio.to_thread(
                confinement.make_workdir, context.job_id, context.attempt, user
            )
            try:
                if confinement.cgroups is not None:
                    cgroup = await asyncio.to_thread(
                        confinement.cgroups.make, context.job_id, context.attempt
                    )
                return await self._run(context, payload, user, workdir, cgroup)
            finally:
                if cgroup is not None:
                    await asyncio.to_thread(cgroups.remove, cgroup)
                await asyncio.to_thread(leftovers.remove_workdir, workdir)
        finally:
            if own_uid:
                assert user is not None
                await self._last_of_owner(user.uid)

    def _owner_lock(self, uid: int) -> asyncio.Lock:
        return self._owner_locks.setdefault(uid, asyncio.Lock())

    async def _last_of_owner(self, uid: int) -> None:
        """Once an owner's last attempt here ended, no process of its uid may remain: kill
        any (a new attempt of the owner waits, so that none of its own is killed)."""
        async with self._owner_lock(uid):
            self._attempts_of[uid] -= 1
            if self._attempts_of[uid] <= 0:
                del self._attempts_of[uid]
                killed = await asyncio.to_thread(leftovers.kill_matching, leftovers.owned_by({uid}))
                if killed:
                    log.warning(
                        "killed processes of an owner with no attempt left",
                        extra={"fields": {"uid": uid, "killed": killed}},
                    )

    async def _run(
        self,
        context: JobContext,
        payload: dict[str, Any],
        user: CommandUser | None,
        workdir: Path,
        cgroup: Path | None,
    ) -> HandlerResult:
        argv: list[str] = payload["argv"]
        timeout_s = payload.get("timeout_s", MAX_TIMEOUT_S)
        confinement = self.confinement
        orders: dict[str, Any] = {
            "argv": argv,
            "env": confinement.environment_for(user, workdir),
            "cwd": str(workdir),
            "uid": None if user is None else user.uid,
            "gid": None if user is None else user.gid,
            "groups": None if user is None else list(user.groups),
            "cgroup": None if cgroup is None else str(cgroup),
            "namespaces": confinement.namespaces,
            "grace_s": context.grace_s,
        }
        started = asyncio.get_running_loop().time()
        try:
            supervised = await Supervised.start(orders)
        except OSError as error:
            return HandlerResult.failed(
                "supervisor_failed",
                f"cannot start the attempt's supervisor: {error.strerror}",
                retryable=True,
            )
        try:
            stopped_by = await supervised.watch(context, timeout_s, workdir, cgroup)
        except asyncio.CancelledError:  # Run itself stops the attempt (self-fencing, shutdown)
            await supervised.stop(context.grace_s, workdir)
            await supervised.close()
            raise
        if stopped_by is not None:
            await supervised.stop(context.grace_s, workdir)
        await supervised.close()
        duration_s = asyncio.get_running_loop().time() - started
        ended = await self._outcome(context, payload, user, workdir, supervised, stopped_by)
        return replace(ended, output=_result(supervised, duration_s))

    async def _outcome(
        self,
        context: JobContext,
        payload: dict[str, Any],
        user: CommandUser | None,
        workdir: Path,
        supervised: Supervised,
        stopped_by: str | None,
    ) -> HandlerResult:
        argv0 = payload["argv"][0]
        said = supervised.said
        if "exec_failed" in said:
            why = said["exec_failed"]
            return HandlerResult.failed("exec_failed", f"cannot start {argv0}: {why}")
        if "setup_failed" in said:
            return HandlerResult.failed(
                "confinement_failed",
                f"the attempt could not be confined: {said['setup_failed']}",
                retryable=True,
            )
        if broken := _broken(supervised.readers):
            return _unreadable(context, broken, supervised.readers[broken])
        if stopped_by == "cancel":
            return HandlerResult("cancelled")
        if stopped_by == "timeout":
            timeout_s = payload.get("timeout_s", MAX_TIMEOUT_S)
            return HandlerResult.failed("timeout", f"killed after {timeout_s} s", retryable=True)
        if "ended" not in said:
            return HandlerResult.failed(
                "confinement_failed",
                "the attempt's supervisor ended without a report",
                retryable=True,
            )
        left = int(said["stopped"])
        if left and not said["requested"]:
            context.log(
                "stderr",
                f"moonrun: stopped {left} process{'' if left == 1 else 'es'} the command left "
                "behind",
            )
        code = said["ended"]
        if code != 0:
            return HandlerResult.failed("exit_status", f"{argv0} exited with status {code}")
        for artifact in payload.get("artifacts", []):
            await self._upload(context, workdir, artifact, user)
        return HandlerResult("succeeded")

    async def _upload(
        self,
        context: JobContext,
        workdir: Path,
        artifact: dict[str, Any],
        user: CommandUser | None,
    ) -> None:
        """Open an artifact now, while the working directory still exists, and hand the open
        file to the uploader; one that may not be uploaded gets a line in the job's logs."""
        path, name = str(artifact.get("path", "")), str(artifact.get("name", ""))
        opened = await asyncio.to_thread(self.confinement.open_artifact, workdir, path, user)
        if isinstance(opened, str):
            context.log("stderr", f"artifact {name} not uploaded: {opened}")
            fields = {"job_id": context.job_id, "artifact": name, "why": opened}
            log.warning("artifact not uploaded", extra={"fields": fields})
            return
        context.upload(opened, name)


async def connect_pipe_reader(
    read_end: int, *, limit: int
) -> tuple[asyncio.BaseTransport, asyncio.StreamReader]:
    """A stream reading the pipe's `read_end`, whose transport closes the descriptor once
    it goes.

    Why the file object does not always own the descriptor: uvloop's pipe transport closes
    the number itself (libuv) and then closes the file object it was handed too
    (MagicStack/uvloop#763, open), so a file another thread opened between the two closes
    lost its descriptor (an artifact Run was about to upload: EBADF). On uvloop the file
    object must leave the descriptor to the transport; the standard loop's transport closes
    it only through the file object."""
    loop = asyncio.get_running_loop()
    owns = not type(loop).__module__.startswith("uvloop")
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader),
        os.fdopen(read_end, "rb", buffering=0, closefd=owns),
    )
    return transport, reader


class Supervised:
    """One attempt's supervisor process, its pipes, and what it said."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        statuses: asyncio.StreamReader,
        streams: dict[str, asyncio.StreamReader],
        transports: list[asyncio.BaseTransport],
        orders: dict[str, Any],
    ) -> None:
        self.process = process
        self.streams = streams
        self.transports = transports
        self.orders = orders
        self.said: dict[str, Any] = {}
        self.bytes_read: dict[str, int] = {"stdout": 0, "stderr": 0}
        self.started = asyncio.get_running_loop().create_future()
        self.statuses = asyncio.create_task(self._read_statuses(statuses))
        self.readers: dict[str, asyncio.Task[None]] = {}

    @classmethod
    async def start(cls, orders: dict[str, Any]) -> Supervised:
        """Start the supervisor and give it its orders (OSError when it cannot start)."""
        pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, status
        (out_r, out_w), (err_r, err_w), (status_r, status_w) = pipes
        try:
            process = await asyncio.create_subprocess_exec(
                *supervisor.command_line(),
                stdin=asyncio.subprocess.PIPE,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(status_w,),
                cwd="/",
                env={},  # Run's environment holds secrets; the command's comes with the orders
                start_new_session=True,
            )
        except BaseException:
            for read_end, _ in pipes:
                os.close(read_end)
            raise
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        transports: list[asyncio.BaseTransport] = []
        readers = []
        read_ends = (out_r, err_r, status_r)
        try:
            for read_end in read_ends:
                transport, reader = await connect_pipe_reader(read_end, limit=2**20)
                transports.append(transport)
                readers.append(reader)
        except BaseException:  # cancelled meanwhile: the supervisor has no orders yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            for opened in transports:
                opened.close()
            # The end being connected went with its transport; those never handed over are
            # still ours (a descriptor left open is harmless, one closed twice is not).
            for read_end in read_ends[len(transports) + 1 :]:
                os.close(read_end)
            raise
        supervised = cls(
            process,
            readers[2],
            {"stdout": readers[0], "stderr": readers[1]},
            transports,
            {**orders, "status_fd": status_w},
        )
        supervised._send(json.dumps(supervised.orders).encode() + b"\n")
        return supervised

    def _send(self, data: bytes) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            with contextlib.suppress(ConnectionError, RuntimeError):
                stdin.write(data)

    async def _read_statuses(self, reader: asyncio.StreamReader) -> None:
        """Every status line the supervisor writes, until it exits; the first settles
        `started`."""
        with contextlib.suppress(ValueError, ConnectionError):
            while line := await reader.readline():
                with contextlib.suppress(ValueError):
                    message = json.loads(line)
                    if isinstance(message, dict):
                        self.said.update(message)
                        if not self.started.done():
                            self.started.set_result(message)
        if not self.started.done():
            self.started.set_result({})

    async def watch(
        self, context: JobContext, timeout_s: float, workdir: Path, cgroup: Path | None
    ) -> str | None:
        """Pump the output until the supervisor ended by itself (None), or why it must be
        stopped: `cancel`, `timeout` or `broken` (a reader failed)."""
        self.readers = {
            name: asyncio.create_task(_pump(stream, name, context, self.bytes_read))
            for name, stream in self.streams.items()
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        cancelled = asyncio.create_task(context.cancelled.wait())
        watched: set[asyncio.Future[Any]] = {
            self.statuses,
            cancelled,
            self.started,
            *self.readers.values(),
        }
        try:
            while True:
                done, watched = await asyncio.wait(
                    watched,
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if self.started in done and "started" in self.started.result():
                    await context.remember_process(self._record(workdir, cgroup))
                if self.statuses in done:
                    return None
                if not done:
                    return "timeout"
                if cancelled in done:
                    return "cancel"
                if _broken(self.readers):
                    return "broken"
        finally:
            cancelled.cancel()

    def _record(self, workdir: Path, cgroup: Path | None) -> dict[str, Any]:
        """What a restarted Run needs to stop this attempt's processes (run/leftovers.py)."""
        record: dict[str, Any] = {
            **leftovers.process_record(self.process.pid),
            "cgroup": None if cgroup is None else str(cgroup),
            "workdir": str(workdir),
        }
        if not self.orders.get("namespaces"):  # pids as the host sees them
            record["session"] = self.said.get("started")
            record["session_started"] = self.said.get("ticks")
        return record

    async def stop(self, grace_s: float, workdir: Path) -> None:
        """Ask the supervisor to stop everything and wait for its report; past the grace and
        a margin, kill it and whatever it left (blocking parts in a thread)."""
        self._send(b"stop\n")
        await asyncio.wait({self.statuses}, timeout=grace_s + STOP_MARGIN_S)
        if self.statuses.done():
            return
        log.warning("an attempt's supervisor did not stop in time; killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        await asyncio.to_thread(self._kill_what_is_left, workdir)
        await asyncio.wait({self.statuses}, timeout=STOP_MARGIN_S)

    def _kill_what_is_left(self, workdir: Path) -> None:
        if self.orders.get("cgroup"):
            cgroups.remove(Path(self.orders["cgroup"]), timeout_s=0)
        tests = [leftovers.working_in(workdir)]
        if not self.orders.get("namespaces") and self.said.get("started"):
            session = int(self.said["started"])
            tests.append(leftovers.in_session(session, int(self.said.get("ticks") or 0)))
        leftovers.kill_matching(*tests)

    async def close(self) -> None:
        """Reap the supervisor, read the output DRAIN_S more, then let go of every pipe."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), STOP_MARGIN_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        if not self.statuses.done():
            await asyncio.wait({self.statuses}, timeout=DRAIN_S)
        if self.readers:
            await asyncio.wait(self.readers.values(), timeout=DRAIN_S)
        for task in [self.statuses, *self.readers.values()]:
            task.cancel()
        await asyncio.gather(self.statuses, *self.readers.values(), return_exceptions=True)
        for transport in self.transports:
            transport.close()
        if not self.started.done():
            self.started.set_result({})


async def _pump(
    stream: asyncio.StreamReader | None, name: str, context: JobContext, counted: dict[str, int]
) -> None:
    """Hand the stream's lines to the logs, reading in chunks until the end: a child never
    blocks on a full pipe, however long its lines. `counted[name]` grows by the bytes read."""
    if stream is None:
        return
    pending = b""
    continued = False
    while chunk := await stream.read(READ_BYTES):
        counted[name] = counted.get(name, 0) + len(chunk)
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


def _result(supervised: Supervised, duration_s: float) -> dict[str, Any]:
    """What an attempt's command did (docs/kinds.md, "command"): its exit code, or the signal
    that ended it (both null when it never started or its end went unreported), how long the
    attempt's processes ran, and the bytes each stream wrote."""
    code = supervised.said.get("ended")
    return {
        "exit_code": code if isinstance(code, int) and code >= 0 else None,
        "signal": -code if isinstance(code, int) and code < 0 else None,
        "duration_s": round(duration_s, 3),
        "stdout_bytes": supervised.bytes_read.get("stdout", 0),
        "stderr_bytes": supervised.bytes_read.get("stderr", 0),
    }


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
