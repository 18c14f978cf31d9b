"""Run's logs and artifacts channels: bounded buffers, their own tasks, their own retries.

Handlers hand lines and files over without ever waiting: when the log buffers are full the
loudest attempt's oldest line is dropped (and counted, and said in its logs); artifact uploads
queue up to a bound and are dropped beyond it (and counted). Nothing here is awaited by a job's
lifecycle or by the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from moonrun.backoff import Backoff
from moonrun.errors import ArtifactTooLarge, InvalidRequest, MoonrunError
from moonrun.run.client import (
    SESSION_ERRORS,
    TRANSIENT,
    PlatformClient,
    log_batch,
    pause_after,
)

log = logging.getLogger("moonrun.run.transfers")

CHUNK_BYTES = 1024 * 1024
MAX_ARTIFACT_BYTES = 1024**3
"""Run's default cap on one artifact (`--max-artifact-bytes`)."""
LINE_CHARS = 16_384
"""What a log line keeps of its text."""
BATCH_BYTES = 768 * 1024
"""A log batch's lines, as JSON, stay below this: the platform refuses log bodies over 1 MiB;
so do the batches of one request together."""
BATCH_OVERHEAD_BYTES = 256
"""A batch's JSON beside its lines (job id, attempt, lease, seq, keys), rounded up."""
MAX_LOG_BATCHES = 500
"""The most batches the platform takes in one request."""
LINE_JSON_BYTES = 80
LOST_NOTE = "earlier line(s) dropped: output outran log shipping"
"""A line's JSON beside its text (`ts`, `stream`, keys and punctuation), rounded up."""
RETRYABLE = (*TRANSIENT, *SESSION_ERRORS)
CHUNK_BACKOFF = Backoff(initial_s=0.5, max_s=30.0)
"""Pauses before a chunk the platform did not take is sent again."""
"""A session being renewed is a pause for transfers, not the end of their attempt."""


@dataclass(frozen=True)
class Attempt:
    job_id: str
    attempt: int
    lease: str


@dataclass(frozen=True)
class Line:
    attempt: Attempt
    ts: str
    stream: str
    text: str
    json_size: int
    """What the line takes in a batch's JSON, its text's escapes included."""


def _line(attempt: Attempt, ts: str, stream: str, text: str) -> Line:
    return Line(attempt, ts, stream, text, _json_len(text) + LINE_JSON_BYTES)


def _json_len(text: str) -> int:
    """`len(json.dumps(text))`, without encoding the common case: a flood of printable ASCII
    lines costs Run's loop a count per line, not a copy."""
    if text.isascii() and text.isprintable():
        return len(text) + 2 + text.count('"') + text.count("\\")
    return len(json.dumps(text))


class _Clock:
    """RFC 3339 UTC timestamps with milliseconds, formatting each second's prefix once: a
    command printing without end calls this once per line."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        now_ms = time.time_ns() // 1_000_000
        second, ms = divmod(now_ms, 1000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return f"{self._prefix}{ms:03d}Z"


class _Buffer:
    """One attempt's lines waiting to be shipped, their JSON bytes, and how many it lost."""

    __slots__ = ("lines", "lost", "size")

    def __init__(self) -> None:
        self.lines: deque[Line] = deque()
        self.size = 0
        self.lost = 0


class LogShipper:
    """Batches log lines about every `interval_s` and posts them on the logs channel.

    Each attempt has its own buffer and its own batch in every flush, so a loud attempt never
    delays or pushes out a quiet one: when the buffers are full, lines go from the attempt
    holding the most, oldest first, and that attempt's next batch begins with a line saying
    how many it lost.
    """

    def __init__(
        self,
        client: PlatformClient,
        *,
        capacity: int = 10_000,
        capacity_bytes: int = 64 * 1024 * 1024,
        attempt_capacity: int = 2_000,
        attempt_capacity_bytes: int = 8 * 1024 * 1024,
        interval_s: float = 1.0,
        batch_lines: int = 500,
        batch_bytes: int = BATCH_BYTES,
        clock_us: Callable[[], int] = lambda: time.time_ns() // 1_000,
    ) -> None:
        self._client = client
        self._clock_us = clock_us
        self._stamps = _Clock()
        self._buffers: dict[Attempt, _Buffer] = {}
        self._lines = self._bytes = 0
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes
        self._attempt_capacity = min(attempt_capacity, capacity)
        self._attempt_capacity_bytes = min(attempt_capacity_bytes, capacity_bytes)
        self._interval_s = interval_s
        self._batch_lines = batch_lines
        self._batch_bytes = batch_bytes
        self._last_seq = 0
        self._pending: dict[Attempt, tuple[int, list[Line], bool]] = {}
        """Per attempt, the batch on its way (sent again unchanged until answered): its seq,
        its lines, and whether it is the attempt's last."""
        self._ended: set[Attempt] = set()
        """Attempts that ended whose last batch has not been sent yet."""
        self._soon = asyncio.Event()
        self.dropped = 0
        self.shipped = 0

    def add(self, attempt: Attempt, stream: str, text: str) -> None:
        """Buffer a line; never blocks. Over a bound, the loudest attempt's oldest line goes."""
        line = _line(attempt, self._stamps.now(), stream, text[:LINE_CHARS])
        buffer = self._buffers.get(attempt)
        if buffer is None:
            buffer = self._buffers[attempt] = _Buffer()
        buffer.lines.append(line)
        buffer.size += line.json_size
        self._lines += 1
        self._bytes += line.json_size
        while len(buffer.lines) > self._attempt_capacity or (
            buffer.size > self._attempt_capacity_bytes and len(buffer.lines) > 1
        ):
            self._drop_oldest(buffer)
        while self._lines > self._capacity or self._bytes > self._capacity_bytes:
            self._drop_oldest(max(self._buffers.values(), key=lambda held: held.size))

    def _drop_oldest(self, buffer: _Buffer) -> None:
        line = buffer.lines.popleft()
        buffer.size -= line.json_size
        buffer.lost += 1
        self._lines -= 1
        self._bytes -= line.json_size
        self.dropped += 1

    def finish(self, attempt: Attempt) -> None:
        """The attempt has ended and added its last line: its last batch says so (`final`),
        the platform then knows its logs are complete. Sent at once, not after the interval:
        someone may be waiting for them."""
        self._ended.add(attempt)
        self._soon.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            soon = asyncio.ensure_future(self._soon.wait())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait(
                    {soon, stopping}, timeout=self._interval_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                soon.cancel()
                stopping.cancel()
            self._soon.clear()
            await self.flush()

    async def flush(self) -> None:
        """Send what is buffered, one batch per attempt (several attempts' batches in a request
        to a platform that takes them so).

        A batch that failed is kept whole under its seq and sent again unchanged before any
        newer line: the platform stores each (job, attempt, seq) once, so a batch that was
        stored but whose answer got lost must not come back with more lines in it.
        """
        if self._client.session is None:
            return
        for attempt, lines in self._take_batches().items():
            self._pending.setdefault(attempt, (self._next_seq(), lines, False))
        # An ended attempt's last batch: its last lines, or none when they all went already.
        for attempt in list(self._ended):
            if attempt in self._pending:
                seq, lines, _ = self._pending[attempt]
                if attempt not in self._buffers:  # nothing after this batch: it is the last
                    self._pending[attempt] = (seq, lines, True)
                    self._ended.discard(attempt)
            elif attempt not in self._buffers:
                self._pending[attempt] = (self._next_seq(), [], True)
                self._ended.discard(attempt)
        pending = list(self._pending.items())
        if getattr(self._client.session, "log_batches", False):
            # Several attempts' batches a request (docs/protocol.md, "Log batches together"):
            # one request each fell behind a busy Run's jobs.
            for group in _groups(pending):
                bodies = [_body(attempt, *batch) for attempt, batch in group]
                try:
                    outcomes = await self._client.send_log_batches(bodies)
                except RETRYABLE:
                    continue  # the whole group stays pending, same seqs, same lines
                for (attempt, (_, lines, _)), outcome in zip(group, outcomes, strict=True):
                    self._settle(attempt, lines, outcome)
            return
        for attempt, (seq, lines, final) in pending:
            refusal: MoonrunError | None = None
            try:
                await self._client.send_logs(**_body(attempt, seq, lines, final))
            except RETRYABLE:
                continue  # stays pending, same seq, same lines
            except MoonrunError as error:
                refusal = error
            self._settle(attempt, lines, refusal)

    def _settle(self, attempt: Attempt, lines: list[Line], outcome: object) -> None:
        """A pending batch answered: stored, kept for the next flush (a transient refusal),
        or dropped for good (the attempt is over: its lines are moot)."""
        if isinstance(outcome, RETRYABLE):
            return  # stays pending, same seq, same lines
        if isinstance(outcome, MoonrunError):
            log.info(
                "log lines dropped",
                extra={"fields": {"job_id": attempt.job_id, "code": outcome.code}},
            )
            self.dropped += len(lines)
            self._ended.discard(attempt)
        else:
            self.shipped += len(lines)
        del self._pending[attempt]

    def _take_batches(self) -> dict[Attempt, list[Line]]:
        """For each attempt without a pending batch, its oldest lines: up to `batch_lines` and
        about `batch_bytes` of JSON (at least one line), after a line counting any it lost."""
        batches: dict[Attempt, list[Line]] = {}
        for attempt, buffer in list(self._buffers.items()):
            if attempt in self._pending:
                continue
            if not buffer.lines and not buffer.lost:  # nothing left to say
                del self._buffers[attempt]
                continue
            batch: list[Line] = []
            if buffer.lost:  # said even when every line it had went (then alone)
                note = (
                    f"[moonrun: {buffer.lost} earlier line(s) dropped: output outran log shipping]"
                )
                ts = buffer.lines[0].ts if buffer.lines else self._stamps.now()
                batch.append(_line(attempt, ts, "stderr", note))
                buffer.lost = 0
            taken = size = 0
            while buffer.lines and taken < self._batch_lines:
                line_size = buffer.lines[0].json_size
                if taken and size + line_size > self._batch_bytes:
                    break
                batch.append(buffer.lines.popleft())
                taken, size = taken + 1, size + line_size
            buffer.size -= size
            self._lines -= taken
            self._bytes -= size
            batches[attempt] = batch
            if not buffer.lines:
                del self._buffers[attempt]
        return batches

    def _next_seq(self) -> int:
        """A seq above every one this shipper gave, and at least the wall clock in µs.

        One count for all attempts (so nothing is kept per attempt, however many a Run runs
        in its life), increasing within each attempt as the platform needs. From the clock,
        so that a restarted Run resuming an attempt never reuses a seq its predecessor sent
        (the platform keeps each seq once): a shipper would have to send more than a million
        batches a second to run ahead of the clock.
        """
        self._last_seq = max(self._last_seq + 1, self._clock_us())
        return self._last_seq


def _body(attempt: Attempt, seq: int, lines: list[Line], final: bool) -> dict[str, Any]:
    """A pending batch as the platform takes it."""
    body = [{"ts": ln.ts, "stream": ln.stream, "text": ln.text} for ln in lines]
    return log_batch(attempt.job_id, attempt.attempt, attempt.lease, seq, body, final=final)


def _groups(
    pending: list[tuple[Attempt, tuple[int, list[Line], bool]]],
) -> list[list[tuple[Attempt, tuple[int, list[Line], bool]]]]:
    """Pending batches in requests of at most `MAX_LOG_BATCHES` and about `BATCH_BYTES` of
    their lines' JSON (each batch alone stays below that), so every body fits the platform's
    1 MiB."""
    groups: list[list[tuple[Attempt, tuple[int, list[Line], bool]]]] = []
    size = 0
    for item in pending:
        lines = item[1][1]
        weight = BATCH_OVERHEAD_BYTES + sum(line.json_size for line in lines)
        if not groups or len(groups[-1]) >= MAX_LOG_BATCHES or size + weight > BATCH_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += weight
    return groups


@dataclass(frozen=True)
class Upload:
    attempt: Attempt
    source: str | BinaryIO
    """A path Run opens when the upload's turn comes, or a file its handler already opened."""
    name: str

    def close(self) -> None:
        if not isinstance(self.source, str):
            self.source.close()


def _no_job_log(attempt: Attempt, stream: str, text: str) -> None:
    pass


class ArtifactUploader:
    """Uploads files in chunks on the artifacts channel, one at a time, retrying with backoff.

    A file is read one chunk at a time (only the chunk being sent is held, for its retries), so
    a huge artifact costs no more memory than a small one; one over `max_bytes`, or one the
    platform refuses as too large, is dropped with a line in its job's logs.
    """

    def __init__(
        self,
        client: PlatformClient,
        *,
        queue_size: int = 64,
        backoff: Backoff = CHUNK_BACKOFF,
        max_bytes: int = MAX_ARTIFACT_BYTES,
        job_log: Callable[[Attempt, str, str], None] = _no_job_log,
    ) -> None:
        self._client = client
        self._queue: asyncio.Queue[Upload] = asyncio.Queue(maxsize=queue_size)
        self._backoff = backoff
        self._max_bytes = max_bytes
        self._job_log = job_log
        self.dropped = 0
        self.uploaded = 0

    def add(self, attempt: Attempt, source: str | BinaryIO, name: str) -> None:
        """Queue a file (a path, or an open binary file the uploader then owns and closes);
        never blocks. A full queue drops the new upload."""
        upload = Upload(attempt, source, name)
        try:
            self._queue.put_nowait(upload)
        except asyncio.QueueFull:
            upload.close()
            self.dropped += 1

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(self._queue.get())
                stopper = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if getter not in done:
                    getter.cancel()
                    return
                await self._upload(getter.result(), stop)
        finally:
            while not self._queue.empty():  # Run stops: what is left is neither sent nor kept
                self._queue.get_nowait().close()

    def _skip(self, upload: Upload, why: str) -> None:
        """Drop an upload for good, saying why in its job's logs."""
        self.dropped += 1
        self._job_log(upload.attempt, "stderr", f"artifact {upload.name} not uploaded: {why}")

    async def _upload(self, upload: Upload, stop: asyncio.Event) -> None:
        try:
            handle, size = await asyncio.to_thread(_opened, upload)
        except OSError as error:
            log.warning("artifact unreadable", extra={"fields": {"error": error.strerror}})
            self.dropped += 1
            return
        try:
            await self._send(upload, handle, size, stop)
        finally:
            await asyncio.to_thread(handle.close)

    async def _send(self, upload: Upload, handle: BinaryIO, size: int, stop: asyncio.Event) -> None:
        if size > self._max_bytes:
            self._skip(upload, f"{size} bytes is over the {self._max_bytes}-byte cap")
            return
        # The size when the upload started is what is sent: a file still growing is cut there,
        # so the cap holds whatever its writer does meanwhile.
        count = max(1, -(-size // CHUNK_BYTES))
        for index in range(count):
            want = min(CHUNK_BYTES, size - index * CHUNK_BYTES)
            try:
                chunk = await asyncio.to_thread(handle.read, want)
            except OSError as error:
                log.warning("artifact unreadable", extra={"fields": {"error": error.strerror}})
                self.dropped += 1
                return
            final = index == count - 1 or len(chunk) < want  # a shrunk file ends early
            delays = self._backoff.delays()
            while True:
                if stop.is_set():
                    return  # interrupted: neither uploaded nor dropped
                try:
                    await self._client.put_chunk(
                        upload.attempt.job_id,
                        upload.attempt.attempt,
                        upload.attempt.lease,
                        upload.name,
                        index,
                        chunk,
                        final=final,
                    )
                    break
                except RETRYABLE as error:
                    with contextlib.suppress(TimeoutError):
                        pause = pause_after(error, delays)
                        await asyncio.wait_for(stop.wait(), timeout=pause)
                except (ArtifactTooLarge, InvalidRequest) as error:  # final: too large, or
                    self._skip(upload, error.message)  # a name the platform does not take
                    return
                except MoonrunError:
                    self.dropped += 1
                    return
            if final:
                break
        self.uploaded += 1


def _opened(upload: Upload) -> tuple[BinaryIO, int]:
    """The upload's file, open, and its size (blocking)."""
    handle = open(upload.source, "rb") if isinstance(upload.source, str) else upload.source  # noqa: SIM115
    try:
        return handle, os.fstat(handle.fileno()).st_size
    except OSError:
        handle.close()
        raise
