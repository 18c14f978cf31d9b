"""Simulated Runs: each host keeps a journal on its "disk" and runs one Run process at a time.

A process follows the rules of `moonrun.run.agent` step for step, on the simulated network
and on its own (skewed, jumping) monotonic clock: register -> reconcile the whole journal
-> resume what was confirmed, drop the rest -> claim up to free capacity -> journal (durably)
-> ack (batched) -> work under lease renewals every lease_ttl/4 (progress), self-fencing when
no renewal was accepted recently enough -> journal the result -> deliver it (batched) until
accepted or refused for good. Any `session_*` / `reconcile_required` answer, and a heartbeat
that succeeds after failures, renew the session (once per generation). Its error classes are
the real Run's (`moonrun.run.client.SESSION_ERRORS`, `TRANSIENT`). What the real Run keeps
on disk is kept across a crash, and what it writes without waiting may be lost in one.
"""

from __future__ import annotations

import copy
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moonrun.errors import MoonrunError, PlatformUnreachable, SequenceRegression
from moonrun.run.client import SESSION_ERRORS, TRANSIENT
from moonrun.scheduling.jobs import JobState
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import ReconcileEntry
from tests.sim.history import Belief, Work
from tests.sim.kernel import Body, Call, LocalClock, Node, Resume, Signal, Sleep, Submit, Wait

if TYPE_CHECKING:
    from tests.sim.world import Simulation

KINDS = {"sim.work": True, "sim.once": False}
"""The job kinds the simulated Runs run, and whether each can resume after a Run restart
(as `sleep` can and `command` cannot)."""


@dataclass(frozen=True)
class RunTimings:
    """The real Run's own timings (moonrun.run.agent.RunConfig, run/client.py CHANNELS), in
    milliseconds and scaled as the simulation's platform timings are."""

    claim_interval_ms: float = 1000
    min_backoff_ms: float = 500
    max_backoff_ms: float = 4000
    control_timeout_ms: float = 2000
    jobs_timeout_ms: float = 3000
    running_write_delay_ms: float = 50
    lazy_write_ms: float = 2
    cancel_ms: tuple[int, int] = (20, 300)
    """How long a handler takes to stop once it is asked to cancel."""


@dataclass
class Entry:
    """One held attempt in the journal (moonrun.run.journal.Assignment)."""

    job_id: str
    attempt: int
    lease: str
    kind: str
    payload: dict[str, Any]
    state: str = "accepted"
    progress_seq: int = 0
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    generation: int
    heartbeat_interval_ms: float
    lease_ttl_ms: float


def outcome_of(payload: dict[str, Any], attempt: int) -> dict[str, Any]:
    """What a simulated job's handler reports for an attempt, from its payload: the first
    `fail` attempts fail retryably, then it fails for good (`fatal`) or succeeds."""
    if attempt <= payload.get("fail", 0):
        return failed("flaky", f"attempt {attempt} failed as asked", retryable=True)
    if payload.get("fatal"):
        return failed("fatal", "failed for good as asked")
    return {"outcome": "succeeded", "retryable": False, "output": {"attempt": attempt}}


def failed(code: str, message: str, *, retryable: bool = False) -> dict[str, Any]:
    return {
        "outcome": "failed",
        "retryable": retryable,
        "error": {"code": code, "message": message},
    }


@dataclass
class RunHost:
    """A host: its endpoint, its data directory (the journal as it is on disk) and, while it
    is up, its Run process."""

    name: str
    endpoint_id: str
    capacity: int
    clock_rate: float
    polls_cancel: bool
    """An older Run that ignores the ack's `cancel_requested` and polls once (protocol 42)."""
    disk: dict[str, Entry] = field(default_factory=dict)
    process: RunProcess | None = None
    boots: int = 0
    self_fenced: int = 0

    @property
    def node(self) -> str:
        return f"run:{self.name}"


class Journal:
    """A process's journal: `entries` as the process holds them, written to the host's disk at
    once (`put`, `sync`: what the real Run waits for) or a little later (`put_later`, `drop`:
    what it does not wait for, and a crash may lose)."""

    def __init__(self, process: RunProcess) -> None:
        self._process = process
        self._disk = process.host.disk
        self.entries: dict[str, Entry] = {job_id: copy.copy(e) for job_id, e in self._disk.items()}
        self._unwritten: dict[str, Entry | None] = {}

    def put(self, *entries: Entry) -> None:
        for entry in entries:
            self.entries[entry.job_id] = entry
            self._unwritten[entry.job_id] = copy.copy(entry)
        self.sync()

    def put_later(self, entry: Entry, delay_ms: float) -> None:
        def write() -> None:
            if entry.state == "running" and self.entries.get(entry.job_id) is entry:
                self._unwritten[entry.job_id] = copy.copy(entry)
                self._process.after(self._process.timings.lazy_write_ms, self.sync)

        self._process.after(delay_ms, write)

    def drop(self, job_id: str) -> None:
        if self.entries.pop(job_id, None) is not None:
            self._unwritten[job_id] = None
            self._process.after(self._process.timings.lazy_write_ms, self.sync)

    def sync(self) -> None:
        for job_id, entry in self._unwritten.items():
            if entry is None:
                self._disk.pop(job_id, None)
            else:
                self._disk[job_id] = entry
        self._unwritten.clear()


class Handler:
    """One run of a job's handler: it works for the payload's `ms`, or stops soon after it is
    asked to cancel. The history records when it worked."""

    def __init__(self, process: RunProcess, entry: Entry) -> None:
        self._process = process
        self.entry = entry
        self.done = Signal()
        self.result: dict[str, Any] | None = None
        self.cancelled = False
        sim = process.sim
        self.work = Work(
            process.host.name, process.boot_id, entry.job_id, entry.attempt, sim.scheduler.now()
        )
        sim.history.work.append(self.work)
        process.handlers.append(self)
        self._timer = sim.scheduler.after(
            entry.payload.get("ms", 100),
            lambda: self._finish(outcome_of(entry.payload, entry.attempt)),
        )

    def cancel(self) -> None:
        if self.cancelled or self.done.is_set():
            return
        self.cancelled = True
        self._timer.cancel()
        low, high = self._process.timings.cancel_ms
        delay = self._process.sim.rng.randint(low, high)
        self._timer = self._process.sim.scheduler.after(
            delay, lambda: self._finish({"outcome": "cancelled", "retryable": False})
        )

    def _finish(self, result: dict[str, Any]) -> None:
        if self.done.is_set() or self.work.end is not None or not self._process.alive:
            return
        self.result = result
        self.work.stop(self._process.sim.scheduler.now(), result["outcome"])
        self.done.set()

    def stop(self, why: str) -> None:
        """The handler is stopped before it finished."""
        self._timer.cancel()
        self.work.stop(self._process.sim.scheduler.now(), why)


class SimBatcher:
    """moonrun.run.batcher.Batcher: what waits together travels together, one batch on its
    way at a time, each job at most once per batch; each submitter gets its own answer."""

    def __init__(self, process: RunProcess, build: Callable[[list[Any]], Call]) -> None:
        self._process = process
        self._build = build
        self._queue: deque[tuple[Any, Resume]] = deque()
        self._sending = False

    def submit(self, item: Any, resume: Resume) -> None:
        self._queue.append((item, resume))
        if not self._sending:
            self._sending = True
            self._process.spawn(self._send_all(), "batcher")

    def _send_all(self) -> Body:
        try:
            while self._queue:
                batch = self._take()
                outcome = yield self._build([item for item, _ in batch])
                answers = outcome if isinstance(outcome, list) else [outcome] * len(batch)
                for (_, resume), answer in zip(batch, answers, strict=True):
                    resume(answer)
        finally:
            self._sending = False

    def _take(self) -> list[tuple[Any, Resume]]:
        batch: list[tuple[Any, Resume]] = []
        deferred: list[tuple[Any, Resume]] = []
        jobs: set[str] = set()
        while self._queue and len(batch) < 1000:
            item, resume = self._queue.popleft()
            if item["job_id"] in jobs:
                deferred.append((item, resume))
                continue
            jobs.add(item["job_id"])
            batch.append((item, resume))
        self._queue.extendleft(reversed(deferred))
        return batch


class RunProcess(Node):
    """One Run process (moonrun.run.agent.Agent) on a host."""

    def __init__(self, sim: Simulation, host: RunHost) -> None:
        start = sim.rng.uniform(0, 1e9)
        super().__init__(
            sim.scheduler, host.node, LocalClock(sim.scheduler, host.clock_rate, start)
        )
        self.sim = sim
        self.host = host
        self.timings: RunTimings = sim.run_timings
        host.boots += 1
        self.boot_id = f"{host.name}.{host.boots}"
        self.journal = Journal(self)
        self.session: SessionInfo | None = None
        self.session_ok = Signal()
        self.slot_freed = Signal()
        self._renewing = False
        self._renew_done = Signal()
        self.running: dict[str, Any] = {}
        """job id -> its supervisor task (a later attempt's replaces an earlier one's)."""
        self.renewed_until: dict[Any, float] = {}
        """Per attempt (`key`): when (local clock) the last accepted renewal was sent, plus
        lease_ttl."""
        self.cancel_known: dict[Any, bool] = {}
        self.confirmed_running: set[Any] = set()
        """Attempts a reconciliation reported `running`: an ack of theirs only repeats."""
        self.handlers: list[Handler] = []
        self.acks = SimBatcher(self, self._ack_call)
        self.results = SimBatcher(self, self._result_call)
        self.spawn(self._main(), "main")

    # -- the network -------------------------------------------------------------------------

    def rpc(self, call: Call, resume: Resume) -> None:
        self.sim.send(self, call, resume)

    def generation(self) -> int | None:
        return self.session.generation if self.session else None

    def _ack_call(self, items: list[dict[str, Any]]) -> Call:
        sid = self.session.session_id if self.session else ""
        acks = [(item["job_id"], Evidence(item["attempt"], item["lease"])) for item in items]
        return Call(
            "ack_many",
            (sid, acks),
            self.timings.jobs_timeout_ms,
            session_id=sid,
            entries=dict(acks),
        )

    def _result_call(self, items: list[dict[str, Any]]) -> Call:
        sid = self.session.session_id if self.session else ""
        results = [
            (item["job_id"], Evidence(item["attempt"], item["lease"]), item["result"])
            for item in items
        ]
        return Call(
            "result_many",
            (sid, results),
            self.timings.jobs_timeout_ms,
            session_id=sid,
            entries={job_id: (evidence, fields) for job_id, evidence, fields in results},
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def _main(self) -> Body:
        yield from self.renew_session(None)
        self.spawn(self._control_loop(), "control")
        self.spawn(self._jobs_loop(), "jobs")

    def crash(self) -> None:
        """The process dies: its handlers stop with it; unwritten journal changes are lost."""
        for handler in self.handlers:
            handler.stop("crashed")
        self.stop()

    # -- session -----------------------------------------------------------------------------

    def renew_session(self, seen_generation: int | None) -> Body:
        """Register again and reconcile the whole journal; once per generation seen."""
        while self._renewing:
            yield Wait(self._renew_done)
        self._renewing = True
        try:
            current = self.session
            if seen_generation is not None and (
                current is None or current.generation != seen_generation
            ):
                return
            self.session_ok.clear()
            delay = self.timings.min_backoff_ms
            host = self.host
            while True:
                registration = yield Call(
                    "register_session",
                    (host.endpoint_id,),
                    self.timings.control_timeout_ms,
                    {"boot_id": self.boot_id, "run_version": "0.1.0", "capacity": host.capacity},
                )
                if isinstance(registration, MoonrunError):
                    yield Sleep(delay)
                    delay = min(self.timings.max_backoff_ms, delay * 2)
                    continue
                self.session = SessionInfo(
                    registration.session.id,
                    registration.session.generation,
                    registration.heartbeat_interval_s * 1000,
                    registration.lease_ttl_s * 1000,
                )
                sent = self.clock.now()
                sid = self.session.session_id
                entries = [
                    ReconcileEntry(e.job_id, e.attempt, e.lease)
                    for e in self.journal.entries.values()
                    if e.state != "self_fenced"
                ]
                report = yield Call(
                    "reconcile",
                    (sid, entries),
                    self.timings.jobs_timeout_ms,
                    session_id=sid,
                    entries={e.job_id: e for e in entries},
                )
                if isinstance(report, MoonrunError):
                    yield Sleep(delay)
                    delay = min(self.timings.max_backoff_ms, delay * 2)
                    continue
                yield from self._apply_reconcile(report, sent)
                self.session_ok.set()
                return
        finally:
            self._renewing = False
            done, self._renew_done = self._renew_done, Signal()
            done.set()

    def _apply_reconcile(self, report: Any, sent: float) -> Body:
        """Keep and resume what the platform confirmed; drop everything else."""
        session = self.session
        assert session is not None
        confirmed = {item.job_id: item for item in report.confirmed}
        for item in report.confirmed:
            self.cancel_known[self.key(item.job_id, item.attempt)] = bool(item.cancel_requested)
        for job_id, item in confirmed.items():
            self.renewed_until[self.key(job_id, item.attempt)] = sent + session.lease_ttl_ms
            if item.state is JobState.RUNNING:  # it goes on working (an accepted one acks first)
                self.confirmed_running.add(self.key(job_id, item.attempt))
                self._believe(job_id, item.attempt)
        for job_id in list(self.journal.entries):
            if job_id in confirmed:
                continue
            self.journal.drop(job_id)
            task = self.running.pop(job_id, None)
            if task is not None and (
                task is not self.current or self.sim.known.reconcile_cancels_its_own_renewal
            ):
                task.cancel()
        self.journal.sync()
        yield Sleep(0)  # the real Run waits for that write here
        for job_id in confirmed:
            if job_id not in self.running and job_id in self.journal.entries:
                self._start(self.journal.entries[job_id], resumed=True)

    # -- control channel -------------------------------------------------------------------

    def _control_loop(self) -> Body:
        lost_contact = False
        lost_generation: int | None = None
        while True:
            session = self.session
            interval = session.heartbeat_interval_ms if session else 1000
            yield Sleep(1000 if lost_contact else interval)
            sid = self.session.session_id if self.session else ""
            answer = yield Call(
                "heartbeat",
                (sid,),
                self.timings.control_timeout_ms,
                session_id=sid,
            )
            if isinstance(answer, SESSION_ERRORS):
                yield from self.renew_session(session.generation if session else None)
                continue
            if isinstance(answer, TRANSIENT):
                if not lost_contact:
                    lost_contact = True
                    lost_generation = session.generation if session else None
                continue
            if isinstance(answer, MoonrunError):
                continue
            if lost_contact:
                lost_contact = False
                yield from self.renew_session(lost_generation)

    # -- jobs channel ------------------------------------------------------------------------

    def _jobs_loop(self) -> Body:
        timings = self.timings
        delay = timings.min_backoff_ms
        while True:
            if not self.session_ok.is_set():
                yield Wait(self.session_ok)
                continue
            free = self.host.capacity - len(self.running)
            if free <= 0:
                self.slot_freed.clear()
                yield Wait(self.slot_freed)
                continue
            generation = self.generation()
            sid = self.session.session_id if self.session else ""
            granted = yield Call(
                "claim",
                (sid, free),
                timings.jobs_timeout_ms,
                session_id=sid,
            )
            if isinstance(granted, SESSION_ERRORS):
                yield from self.renew_session(generation)
                continue
            if isinstance(granted, MoonrunError):
                yield Sleep(delay)
                delay = min(timings.max_backoff_ms, delay * 2)
                continue
            delay = timings.min_backoff_ms
            if granted:
                yield from self._accept(granted)
            else:  # the simulated platform does not hold claims: Run polls then
                yield Sleep(timings.claim_interval_ms)

    def _accept(self, granted: list[Any]) -> Body:
        """Journal every granted attempt (durably) before acking any of them."""
        entries = [
            Entry(job.job_id, job.attempt, job.lease, job.kind, _payload(job.payload_json))
            for job in granted
        ]
        self.journal.put(*entries)
        yield Sleep(0)  # waits for the disk
        for entry in entries:
            self._start(entry, resumed=False)

    def _start(self, entry: Entry, *, resumed: bool) -> None:
        box: dict[str, Any] = {}
        box["task"] = self.spawn(self._supervise(entry, resumed, box), f"supervise {entry.job_id}")
        self.running[entry.job_id] = box["task"]

    def _supervise(self, entry: Entry, resumed: bool, box: dict[str, Any]) -> Body:
        """Everything about one held attempt, from ack to an accepted result."""
        try:
            if entry.state == "accepted":
                acked = yield from self._ack(entry)
                if not acked:
                    self._forget(entry)
                    return
            if entry.state == "running":
                result = yield from self._execute(entry, resumed)
                if result is None:
                    return
                entry.state, entry.result = "finished", result
                self._save(entry)
                yield Sleep(0)  # waits for the disk
            if entry.state == "finished":
                yield from self._deliver(entry)
        finally:
            if self.running.get(entry.job_id) is box.get("task"):
                del self.running[entry.job_id]
            self.renewed_until.pop(self.key(entry.job_id, entry.attempt), None)
            self.slot_freed.set()

    def key(self, job_id: str, attempt: int) -> Any:
        """What renewals and cancel news are kept under: the attempt (the agent: the job)."""
        return job_id if self.sim.known.renewals_keyed_by_job else (job_id, attempt)

    def _believe(self, job_id: str, attempt: int) -> None:
        """Record until when (true time) this process now thinks it may work on the attempt."""
        if self.session is None:
            return
        margin = self.session.lease_ttl_ms / 8
        until = self.clock.true_at(self.renewed_until.get(self.key(job_id, attempt), 0.0) - margin)
        now = self.sim.scheduler.now()
        belief = Belief(self.host.name, self.boot_id, job_id, attempt, now, until)
        self.sim.history.beliefs.append(belief)

    def _save(self, entry: Entry) -> None:
        if self.journal.entries.get(entry.job_id) is entry:
            self.journal.put(entry)

    def _forget(self, entry: Entry) -> None:
        if self.journal.entries.get(entry.job_id) is entry:
            self.journal.drop(entry.job_id)

    def _settle(self, entry: Entry, batcher: SimBatcher, item: dict[str, Any]) -> Body:
        """Send until accepted: returns (local clock) when the first and the accepted request
        were sent, and the answer; or None (refused for good, or dropped by a reconciliation
        meanwhile)."""
        delay = self.timings.min_backoff_ms
        first: float | None = None
        while True:
            generation, sent = self.generation(), self.clock.now()
            first = sent if first is None else first
            answer = yield Submit(batcher, item)
            if not isinstance(answer, MoonrunError):
                return first, sent, answer
            if isinstance(answer, SESSION_ERRORS):
                yield from self.renew_session(generation)
                if self.journal.entries.get(entry.job_id) is not entry:
                    return None
            elif isinstance(answer, TRANSIENT):
                yield Sleep(delay)
                delay = min(self.timings.max_backoff_ms, delay * 2)
            else:
                return None

    def _ack(self, entry: Entry) -> Body:
        item = {"job_id": entry.job_id, "attempt": entry.attempt, "lease": entry.lease}
        settled = yield from self._settle(entry, self.acks, item)
        session = self.session
        if settled is None or session is None:
            return False
        first, sent, answer = settled
        key = self.key(entry.job_id, entry.attempt)
        self.cancel_known[key] = bool(answer.cancel_requested)
        if self.sim.known.ack_lease_from_last_send:
            self.renewed_until[key] = sent + session.lease_ttl_ms
        elif key not in self.confirmed_running:
            # Only the ack that moved the attempt to running renewed its lease, and it was
            # one of this process's: the lease runs at least from the first of them. (A
            # repeated ack renews nothing; an attempt a reconciliation reported running was
            # acked before, and its lease is what that reconciliation renewed.)
            known = self.renewed_until.get(key, 0.0)
            self.renewed_until[key] = max(known, first + session.lease_ttl_ms)
        self._believe(entry.job_id, entry.attempt)
        entry.state = "running"
        # Journaled a little later, not waited for (the real Run's RUNNING_WRITE_DELAY_S).
        self.journal.put_later(entry, self.timings.running_write_delay_ms)
        return True

    def _execute(self, entry: Entry, resumed: bool) -> Body:
        """Run the handler under lease renewals; None when the attempt was given up."""
        resumable = KINDS.get(entry.kind)
        if resumable is None:
            return failed("unknown_kind", f"this Run has no handler for {entry.kind}")
        if resumed and not resumable:
            return failed(
                "run_restarted", "Run restarted and this kind cannot resume", retryable=True
            )
        known = self.cancel_known.pop(self.key(entry.job_id, entry.attempt), None)
        if known is None or self.host.polls_cancel:
            sid = self.session.session_id if self.session else ""
            evidence = Evidence(entry.attempt, entry.lease)
            answer = yield Call(
                "cancel_poll",
                (sid, entry.job_id, evidence),
                self.timings.jobs_timeout_ms,
                session_id=sid,
                entries={entry.job_id: evidence},
            )
            if not isinstance(answer, MoonrunError):
                known = bool(answer.cancel_requested)
        session = self.session
        if session is not None and not self.sim.known.handler_starts_without_lease_check:
            tick, margin = session.lease_ttl_ms / 4, session.lease_ttl_ms / 8
            renewed_until = self.renewed_until.get(self.key(entry.job_id, entry.attempt), 0.0)
            if self.clock.now() + tick >= renewed_until - margin:
                yield from self._self_fence(entry, None)
                return None
        handler = Handler(self, entry)
        if known:
            handler.cancel()
        try:
            kept = yield from self._renew_while(handler, entry)
        finally:
            if not handler.done.is_set():
                handler.stop("dropped")
        if not kept:
            return None
        return handler.result

    def _renew_while(self, handler: Handler, entry: Entry) -> Body:
        """Renew the lease every lease_ttl/4 until the handler is done; False when Run gave up."""
        session = self.session
        assert session is not None
        tick, margin = session.lease_ttl_ms / 4, session.lease_ttl_ms / 8
        job_id = entry.job_id
        key = self.key(job_id, entry.attempt)
        while True:
            yield Wait(handler.done, tick)
            if handler.done.is_set():
                return True
            entry.progress_seq += 1
            self._save(entry)  # before sending: a restart never reuses a seq the platform saw
            yield Sleep(0)
            generation, sent = self.generation(), self.clock.now()
            budget = self.renewed_until.get(key, 0.0) - margin - sent
            answer: Any = PlatformUnreachable("no time left to renew")
            if budget > 0:
                sid = self.session.session_id if self.session else ""
                evidence, seq = Evidence(entry.attempt, entry.lease), entry.progress_seq
                answer = yield Call(
                    "progress",
                    (sid, job_id, evidence),
                    min(budget, self.timings.jobs_timeout_ms),
                    {"seq": seq},
                    session_id=sid,
                    entries={job_id: (evidence, seq)},
                )
            if not isinstance(answer, MoonrunError):
                lease_ttl = self.session.lease_ttl_ms if self.session else 0
                self.renewed_until[key] = sent + lease_ttl
                self._believe(job_id, entry.attempt)
                if answer.cancel_requested:
                    handler.cancel()
            elif isinstance(answer, SESSION_ERRORS):
                self.spawn(self.renew_session(generation), "renew")
            elif isinstance(answer, SequenceRegression):
                entry.progress_seq += 1000
            elif isinstance(answer, TRANSIENT):
                pass
            else:  # the platform gave the attempt away
                self._forget(entry)
                handler.stop("refused")
                return False
            if self.clock.now() + tick >= self.renewed_until.get(key, 0.0) - margin:
                yield from self._self_fence(entry, handler)
                return False

    def _self_fence(self, entry: Entry, handler: Handler | None) -> Body:
        """Stop an attempt whose lease may lapse before another renewal could be accepted."""
        self.host.self_fenced += 1
        self.sim.history.self_fences += 1
        entry.state = "self_fenced"
        self._save(entry)
        if handler is not None:
            handler.stop("self_fenced")
        yield Sleep(0)  # waits for the disk

    def _deliver(self, entry: Entry) -> Body:
        """Send the result until it is accepted or refused for good (same fingerprint)."""
        assert entry.result is not None
        item = {
            "job_id": entry.job_id,
            "attempt": entry.attempt,
            "lease": entry.lease,
            "result": entry.result,
        }
        yield from self._settle(entry, self.results, item)
        self._forget(entry)


def _payload(payload_json: str) -> dict[str, Any]:
    payload = json.loads(payload_json)
    assert isinstance(payload, dict)
    return payload


def choose_rate(rng: random.Random, drift: float) -> float:
    """A clock rate within `drift` of true time."""
    return 1.0 + rng.uniform(-drift, drift)
