"""What Run's own tests share: one fake of Run's platform client (its transfer channels, and
with `jobs` a platform that hands out jobs), one fake of what Run hands a handler (a
`JobContext` and where its lines, uploads and process records go), and probes of a command's
process group."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from moonrun.errors import MoonrunError, PlatformUnreachable
from moonrun.run.agent import Agent, RunConfig
from moonrun.run.client import SessionInfo
from moonrun.run.handlers import HandlerResult, JobContext
from moonrun.run.identity import Identity
from moonrun.run.journal import Journal

HANG_GUARD_S = 30.0
"""Only a guard against a hang; every wait it bounds is expected to end well before it."""


class FakeRunClient:
    """The logs and artifacts side of `moonrun.run.client.PlatformClient`.

    `errors` are raised, in order, by the next calls of either kind; `chunk_errors` once by the
    chunk of that index. With `keep_bytes=False` a chunk is recorded by its size only (the
    artifact tests stream gigabytes). With `lease`, every call must carry that lease. With
    `record=False` a log batch is only counted (a long run keeps nothing per batch).

    For an `Agent`, `jobs` makes it a platform too: registration, reconciliation and heartbeats
    succeed, a claim hands out `noop` jobs from what `offer` made available (and otherwise
    waits until more is offered, or the claim is abandoned), every ack and result is accepted.
    Job number N (from 0) is of kind `kind_of(N)`. With `renewals=False` no lease renewal is
    ever answered (`progress` is unreachable), so an attempt still at work self-fences. Only
    counts are kept (`acked`, `reported`, `log_lines`), never a record per job.
    """

    def __init__(
        self,
        *,
        lease: str | None = None,
        chunk_errors: dict[int, Exception] | None = None,
        keep_bytes: bool = True,
        record: bool = True,
        jobs: bool = False,
        lease_ttl_s: float = 120.0,
        kind_of: Callable[[int], str] = lambda number: "noop",
        renewals: bool = True,
        claims_with_results: bool = False,
        silent_results: bool = False,
        log_batches: bool = False,
    ) -> None:
        self.log_batches = log_batches
        self.session: Any = None if jobs else SimpleNamespace(log_batches=log_batches)
        self.claims_with_results = claims_with_results
        self.claims = self.claimed_with_results = 0
        """Claims asked apart (`claim`), and jobs granted in results' answers."""
        self.silent_results = silent_results
        self.silent_jobs: list[str] = []
        """The jobs whose result said `silent` (kept only when `record`)."""
        self.record = record
        self.lease_ttl_s = lease_ttl_s
        self.kind_of = kind_of
        self.renewals = renewals
        self.offered = self.granted = self.acked = self.reported = self.log_lines = 0
        self.generation = 0
        self._more = asyncio.Event()
        self.announced: list[tuple[str, int]] = []
        """Attempts whose cancel the fake platform announces (`announce`)."""
        self._announced = asyncio.Event()
        self.lease = lease
        self.errors: list[Exception] = []
        self.chunk_errors = dict(chunk_errors or {})
        self.keep_bytes = keep_bytes
        self.log_calls: list[tuple[str, int, int, list[str]]] = []
        """(job, attempt, seq counted from the attempt's first as 1, line texts) per batch."""
        self.chunk_calls: list[tuple[str, int, str, int, bytes | int, bool]] = []
        """(job, attempt, name, index, the bytes or their size, final) per chunk."""
        self.first_seqs: dict[tuple[str, int], int] = {}
        self.finals = 0
        self.final_calls: list[tuple[str, int, int]] = []
        self.log_requests = 0
        """Requests on the logs channel: one per `send_logs`, one per `send_log_batches`."""

    async def send_logs(self, *batch: Any, **fields: Any) -> Any:
        """One batch in one request (`_store_logs` says what is kept of it)."""
        self.log_requests += 1
        return await self._store_logs(*batch, **fields)

    async def send_log_batches(self, batches: list[dict[str, Any]]) -> list[Any]:
        """Each batch as `send_logs` takes it, in one request (a platform that says
        `log_batches`); an error raised for one batch is its answer."""
        assert self.log_batches, "log batches together to a platform that says not"
        self.log_requests += 1
        answers: list[Any] = []
        for batch in batches:
            try:
                answers.append(await self._store_logs(**batch))
            except MoonrunError as error:
                answers.append(error)
        return answers

    async def _store_logs(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        seq: int,
        lines: list[dict[str, str]],
        *,
        final: bool = False,
    ) -> Any:
        """Records seqs relative to the attempt's first (1, 2, ...): absolute seqs start from
        the wall clock so that a restarted Run never reuses one. A `final` batch is counted
        in `finals` (and its attempt noted in `final_calls`: (job, attempt, seq from 1))."""
        assert self.lease is None or lease == self.lease
        assert all(set(line) == {"ts", "stream", "text"} for line in lines)
        self.log_lines += len(lines)
        self.finals += final
        if not self.record:
            return {"accepted_through_seq": seq}
        first = self.first_seqs.setdefault((job_id, attempt), seq)
        self.log_calls.append((job_id, attempt, seq - first + 1, [line["text"] for line in lines]))
        if final:
            self.final_calls.append((job_id, attempt, seq - first + 1))
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
        assert self.lease is None or lease == self.lease
        kept = data if self.keep_bytes else len(data)
        self.chunk_calls.append((job_id, attempt, name, index, kept, final))
        if index in self.chunk_errors:
            raise self.chunk_errors.pop(index)
        if self.errors:
            raise self.errors.pop(0)
        return {"chunk_index": index, "final": final}

    # -- the control and jobs channels (with `jobs`) ---------------------------------------------

    async def __aenter__(self) -> FakeRunClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        pass

    def offer(self, count: int) -> None:
        """Make `count` more jobs claimable."""
        self.offered += count
        self._more.set()

    async def register(self, boot_id: str, capacity: int, kinds: Any = None) -> SessionInfo:
        self.generation += 1
        self.session = SessionInfo(
            session_id=f"session_{self.generation}",
            key=bytes(32),
            generation=self.generation,
            heartbeat_interval_s=10.0,
            session_ttl_s=60.0,
            ack_timeout_s=30.0,
            lease_ttl_s=self.lease_ttl_s,
            claims_with_results=self.claims_with_results,
            silent_results=self.silent_results,
            log_batches=self.log_batches,
        )
        return self.session

    async def reconcile(self, entries: list[dict[str, Any]]) -> Any:
        confirmed = [{**entry, "state": "accepted", "cancel_requested": False} for entry in entries]
        return {"confirmed": confirmed, "discard": [], "lost": []}

    async def heartbeat(self) -> Any:
        return {"session_expires_at": "2026-01-01T00:00:00Z", "server_time": "2026-01-01T00:00:00Z"}

    async def end_session(self, timeout_s: float) -> None:
        self.session = None

    async def claim(self, max_jobs: int, wait_s: float | None = None) -> list[Any]:
        self.claims += 1
        while self.granted >= self.offered:
            self._more.clear()
            await self._more.wait()
        return self._grant(max_jobs)

    def _grant(self, max_jobs: int) -> list[Any]:
        count = min(max_jobs, self.offered - self.granted)
        first, self.granted = self.granted, self.granted + count
        return [
            {
                "job_id": f"job_{number}",
                "attempt": 1,
                "lease": f"lease_{number}",
                "kind": self.kind_of(number),
                "payload": {},
                "server_id": "server_1",
                "owner_id": "owner_1",
            }
            for number in range(first, first + count)
        ]

    async def acks(self, acks: list[dict[str, Any]]) -> list[Any]:
        self.acked += len(acks)
        return [{"cancel_requested": False} for _ in acks]

    async def results(self, results: list[dict[str, Any]]) -> list[Any]:
        self.reported += len(results)
        if self.record:
            self.silent_jobs += [r["job_id"] for r in results if r.get("silent") is True]
        return [{"state": "succeeded"} for _ in results]

    async def results_and_claim(
        self, results: list[dict[str, Any]], max_jobs: int | None
    ) -> tuple[list[Any], list[Any]]:
        """`results`, and what is offered, up to `max_jobs`, granted at once (never waits)."""
        assert self.claims_with_results, "claimed with results from a platform that says not"
        answers = await self.results(results)
        granted = self._grant(max_jobs) if max_jobs else []
        self.claimed_with_results += len(granted)
        return answers, granted

    async def progress(self, job_id: str, attempt: int, lease: str, seq: int, *_: Any) -> Any:
        if not self.renewals:
            raise PlatformUnreachable("the fake platform answers no renewal")
        return {"cancel_requested": False}

    async def cancel_poll(self, job_id: str, attempt: int, lease: str) -> Any:
        return {"cancel_requested": False}

    async def watch_cancels(self, known: list[tuple[str, int]], wait_s: float) -> Any:
        """Holds the long poll until `announce` names attempts Run does not know yet."""
        while True:
            fresh = [key for key in self.announced if key not in known]
            if fresh:
                return fresh
            self._announced.clear()
            await self._announced.wait()

    def announce(self, job_id: str, attempt: int) -> None:
        """A user asked to cancel this attempt: the next cancel watch answers it."""
        self.announced.append((job_id, attempt))
        self._announced.set()

    @property
    def chunks(self) -> list[tuple[str, int, int, bool]]:
        """(name, index, size, final) of every chunk sent."""
        return [
            (name, index, data if isinstance(data, int) else len(data), final)
            for _, _, name, index, data, final in self.chunk_calls
        ]


async def run_agent(
    tmp_path: Path, client: FakeRunClient, handlers: dict[str, Any], *, jobs: int, capacity: int
) -> None:
    """One real `Agent` (data in `tmp_path`) against `client` (a fake platform, `jobs=True`):
    `jobs` jobs offered, run until each is reported and none runs any more, then stopped (Run
    sends what its transfers hold before it stops)."""
    config = RunConfig(
        platform_url="http://fake.invalid", data_dir=tmp_path, capacity=capacity, claim_wait_s=25.0
    )
    identity = Identity.__new__(Identity)  # never used: the fake client signs nothing
    agent = Agent(config, identity, Journal.open(tmp_path), handlers, client=client)  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        client.offer(jobs)
        while client.reported < jobs or agent._running:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(running, HANG_GUARD_S)


# -- a handler's context ------------------------------------------------------------------------


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Sink:
    """What a handler handed back: log lines per stream, uploads, what it asked Run to
    remember of its processes."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    uploads: list[tuple[Any, str]] = field(default_factory=list)
    records: list[int | dict[str, Any]] = field(default_factory=list)

    def log_line(self, stream: str, text: str) -> None:
        self.lines.append((stream, text))

    def upload(self, source: Any, name: str) -> None:
        self.uploads.append((source, name))

    async def remember_process(self, record: int | dict[str, Any]) -> None:
        self.records.append(record)

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
    owner_id: str | None = None,
) -> JobContext:
    """Attempt 1 of job `job_1`, started at `started_at_ms` (now by default) on `now_ms`."""
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
        owner_id=owner_id,
    )


def command_context(
    argv: list[str],
    sink: Sink | None = None,
    *,
    owner_id: str | None = None,
    grace_s: float = 1.0,
    **payload: Any,
) -> JobContext:
    """A `command` attempt running `argv`, on a clock that stands at 0."""
    return job_context(
        "command",
        {"argv": argv, **payload},
        sink,
        started_at_ms=0,
        now_ms=lambda: 0,
        grace_s=grace_s,
        owner_id=owner_id,
    )


async def finished(handler: Any, context: JobContext) -> HandlerResult:
    """The handler's result, or a failure once HANG_GUARD_S has passed."""
    result: HandlerResult = await asyncio.wait_for(handler.run(context), HANG_GUARD_S)
    return result


# -- a command's processes ----------------------------------------------------------------------


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


async def group_gone(pgid: int, within_s: float = HANG_GUARD_S) -> bool:
    """Whether the process group is gone, polling until `within_s` has passed."""
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
