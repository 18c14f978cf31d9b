"""The Run agent: register -> reconcile -> resume -> claim -> journal -> ack -> execute.

Four loops run side by side, each on its own channel: control (heartbeat), jobs (claims, and
one supervisor task per held attempt: ack, progress, cancel, result), logs and artifacts.
An idle Run keeps one claim waiting at the platform (a long poll), so a new job starts at
once. Supervisors' acks and results travel in batches (`Batcher`), each answer going back to
its own supervisor. Any `session_*` or `reconcile_required` answer makes Run register again and
reconcile its whole journal before it claims anything else. A supervisor that cannot get a
lease renewal accepted in time stops its own attempt (self-fencing): Run never works on a lease
the platform may already have handed to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from moonrun.backoff import Backoff, jittered
from moonrun.errors import MethodNotAllowed, MoonrunError, NotFound, SequenceRegression
from moonrun.run.batcher import Batcher
from moonrun.run.client import (
    BATCH_BYTES,
    BATCH_ITEMS,
    SESSION_ERRORS,
    TRANSIENT,
    PlatformClient,
    pause_after,
)
from moonrun.run.handlers import (
    Handler,
    HandlerResult,
    JobContext,
    advertised_kinds,
    payload_checker,
    refuse_payload,
)
from moonrun.run.identity import Identity
from moonrun.run.journal import Assignment, Journal
from moonrun.run.leftovers import process_record, stop_left_behind
from moonrun.run.transfers import MAX_ARTIFACT_BYTES, ArtifactUploader, Attempt, LogShipper
from moonrun.security.tokens import b64url
from moonrun.wire.run import Grant, ReconcileAnswer, ResultAnswer

log = logging.getLogger("moonrun.run")

T = TypeVar("T")

Message = dict[str, Any]
"""One batch entry: `job_id`, `attempt`, `lease`, and for a result its fields."""


RUNNING_WRITE_DELAY_S = 0.05
"""How long after its ack an attempt's `running` state waits to be journaled on its own."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


MessageAnswer = TypeVar("MessageAnswer")


def message_batcher(
    send: Callable[[list[Message]], Awaitable[Sequence[MessageAnswer | Exception]]],
) -> Batcher[Message, MessageAnswer]:
    """Batches of acks or results: one entry per job, within the platform's bounds."""
    return Batcher(
        send,
        max_items=BATCH_ITEMS,
        size=lambda item: len(json.dumps(item)) + 1,
        max_size=BATCH_BYTES,
        key=lambda item: item["job_id"],
    )


RETRY_BACKOFF = Backoff(initial_s=0.5, max_s=10.0)
HEARTBEAT_JITTER = 0.1
"""Each pause between heartbeats is the platform's interval give or take a tenth."""
CLAIM_WAIT_JITTER = 0.1
"""Each claim's wait is `claim_wait_s` give or take a tenth."""
WATCH_IDLE_S = 1.0
"""A cancel watch is given up once no handler has run for this long."""


@dataclass(frozen=True)
class RunConfig:
    platform_url: str
    data_dir: Path
    capacity: int
    claim_wait_s: float = 50.0
    """How long an idle Run's claim waits at the platform for work (it caps this at 60 s; an
    older platform at 30 s). An idle fleet's cost is its claims and heartbeats: at 5,000 Runs
    a claim of 50 s rather than 25 s took the platform from 16-17% to 10% of a core."""
    claim_interval_s: float = 1.0
    """The least time between two claims that both came back empty at once."""
    log_interval_s: float = 1.0
    cancel_grace_s: float = 10.0
    grace_s: float = 30.0
    """On a graceful stop, how long held attempts may take to finish before they are stopped."""
    end_session_timeout_s: float = 5.0
    max_artifact_bytes: int = MAX_ARTIFACT_BYTES
    """A bigger artifact is not uploaded (a line in its job's logs says so)."""
    backoff: Backoff = RETRY_BACKOFF
    """Pauses before Run tries a refused or unanswered registration, claim, ack or result again."""
    owner_uids: bool = False
    """Whether commands run under a uid per owner (`--run-as-range`), which needs each
    grant's `owner_id`."""
    draw: Callable[[], float] = field(default=random.random, compare=False, repr=False)
    """Uniform in [0, 1): the jitter of heartbeats and claim waits (a test passes a seeded
    one)."""


class Agent:
    """One Run process: its journal, its session, and the attempts it holds."""

    def __init__(
        self,
        config: RunConfig,
        identity: Identity,
        journal: Journal,
        handlers: dict[str, Handler],
        *,
        now_ms: Callable[[], int] = wall_ms,
        client: PlatformClient | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.handlers = handlers
        self.kinds = advertised_kinds(handlers)
        self._checkers = {kind: payload_checker(handler) for kind, handler in handlers.items()}
        self.boot_id = b64url(secrets.token_bytes(16))
        self.client = client or PlatformClient(
            config.platform_url, identity.endpoint_id, identity.key
        )
        self._acks = message_batcher(self.client.acks)
        self._results = message_batcher(self._send_results)
        self.logs = LogShipper(self.client, interval_s=config.log_interval_s)
        self.artifacts = ArtifactUploader(
            self.client, max_bytes=config.max_artifact_bytes, job_log=self.logs.add
        )
        self._now_ms = now_ms
        self._running: dict[str, asyncio.Task[None]] = {}
        self._renewed_until: dict[tuple[str, int], float] = {}
        """Per attempt (job id, attempt): until when (monotonic) its lease surely holds. Per
        attempt, not per job: a job granted again to this Run may have two supervisors for a
        moment, and neither may read the other's renewals."""
        self._cancel_known: dict[tuple[str, int], bool] = {}
        """Per attempt: whether a cancel was requested, as the ack or the reconciliation said
        (no poll)."""
        self._contexts: dict[tuple[str, int], JobContext] = {}
        """The attempts whose handler runs now (job id, attempt): where a cancel the platform
        announces is told at once (`_cancels_loop`)."""
        self._spoke: set[tuple[str, int]] = set()
        """The attempts supervised now that have printed a log line (job id, attempt): any
        other one ends silent (`_silent`)."""
        self._handler_started = asyncio.Event()
        self._no_handler = asyncio.Event()
        """Set while no handler runs: a cancel watch then has nothing left to tell."""
        self._no_handler.set()
        self._session_ok = asyncio.Event()
        self._renew_lock = asyncio.Lock()
        self._slot_freed = asyncio.Event()
        self._stop = asyncio.Event()
        self._draining = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self.self_fenced = 0
        self._owner_missing_said = False

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, drain: asyncio.Event | None = None) -> None:
        """Run until `stop` is set; held attempts stay in the journal for the next start.

        Once `drain` is set (a first SIGTERM), Run claims nothing more and gives its held
        attempts `grace_s` to finish and deliver their results, then stops by itself.
        Stopping ends the session, so the endpoint shows offline at once.
        """
        self._stop = stop
        self._draining = drain or asyncio.Event()
        async with self.client:
            # Watching for the drain from the start: a signal during the first registration
            # (a platform that does not answer) stops Run at once, nothing being held yet.
            drainer = asyncio.create_task(self._drain_loop())
            try:
                await self._renew_session(None)
                async with asyncio.TaskGroup() as loops:
                    loops.create_task(self._control_loop())
                    loops.create_task(self._jobs_loop())
                    loops.create_task(self._cancels_loop())
                    loops.create_task(self.logs.run(stop))
                    loops.create_task(self.artifacts.run(stop))
            finally:
                drainer.cancel()
                await asyncio.gather(drainer, return_exceptions=True)
                supervisors = list(self._running.values())
                for task in supervisors:
                    task.cancel()
                await asyncio.gather(*supervisors, return_exceptions=True)
                await self.logs.flush()
                await self.journal.close()
                await self._end_session()

    async def _drain_loop(self) -> None:
        """After `drain`: no more claims; wait (up to grace_s) for held attempts, then stop."""
        await self._until(self._draining)
        if self._stop.is_set():
            return
        log.info(
            "stopping: no more claims, waiting for held attempts",
            extra={"fields": {"held": len(self._running), "grace_s": self.config.grace_s}},
        )
        self._slot_freed.set()  # wake the jobs loop, so that it sees the drain
        deadline = time.monotonic() + self.config.grace_s
        while self._running and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "grace over: stopping held attempts",
                    extra={"fields": {"held": len(self._running)}},
                )
                break
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until(self._slot_freed), timeout=remaining)
        self._stop.set()

    async def _end_session(self) -> None:
        """Tell the platform this session is over; a failure only leaves it to expire."""
        if self.client.session is None:
            return
        try:
            await self.client.end_session(self.config.end_session_timeout_s)
        except MoonrunError as error:
            log.warning("ending the session failed", extra={"fields": {"code": error.code}})
            return
        log.info("session ended")

    async def _pause(self, seconds: float) -> None:
        """Wait, but wake at once when Run stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _until(self, event: asyncio.Event) -> None:
        """Wait for `event`, or for Run to stop."""
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _save(self, entry: Assignment) -> None:
        """Journal `entry` as it is now, durably; not once the journal has dropped it (a
        reconciliation did, and cancels its supervisor)."""
        if self.journal.entries.get(entry.job_id) is entry:
            await self.journal.put(entry)

    def _save_later(self, entry: Assignment) -> None:
        """`_save` without waiting for the disk."""
        if self.journal.entries.get(entry.job_id) is entry:
            self.journal.put(entry)

    def _save_if_running(self, entry: Assignment) -> None:
        """Journal a running attempt, without waiting, unless it has moved on meanwhile."""
        if entry.state == "running" and self.journal.entries.get(entry.job_id) is entry:
            self.journal.put(entry)

    def _generation(self) -> int | None:
        """The session generation a request sent now is signed for."""
        return self.client.session.generation if self.client.session else None

    # -- session ---------------------------------------------------------------------------

    async def _renew_session(self, seen_generation: int | None) -> None:
        """Register again and reconcile the whole journal; once per generation seen."""
        async with self._renew_lock:
            current = self.client.session
            if seen_generation is not None and (
                current is None or current.generation != seen_generation
            ):
                return  # another task already renewed since that answer was given
            self._session_ok.clear()
            delays = self.config.backoff.delays()
            while not self._stop.is_set():
                try:
                    await self.client.register(self.boot_id, self.config.capacity, self.kinds)
                    sent = time.monotonic()
                    report = await self.client.reconcile(self._journal_entries())
                    await self._apply_reconcile(report, sent)
                    self._session_ok.set()
                    log.info(
                        "registered and reconciled",
                        extra={
                            "fields": {
                                "generation": self.client.session.generation
                                if self.client.session
                                else None,
                                "confirmed": len(report["confirmed"]),
                                "discarded": len(report["discard"]),
                                "lost": len(report["lost"]),
                            }
                        },
                    )
                    return
                except MoonrunError as error:
                    log.warning(
                        "register and reconcile failed; retrying",
                        extra={"fields": {"code": error.code, "error": error.message[:200]}},
                    )
                    await self._pause(pause_after(error, delays))

    def _journal_entries(self) -> list[dict[str, Any]]:
        return [
            {"job_id": entry.job_id, "attempt": entry.attempt, "lease": entry.lease}
            for entry in self.journal.entries.values()
            if entry.state != "self_fenced"
        ]

    async def _apply_reconcile(self, report: ReconcileAnswer, sent: float) -> None:
        """Keep and resume what the platform confirmed; drop everything else."""
        session = self.client.session
        assert session is not None
        confirmed = {item["job_id"]: item for item in report["confirmed"]}
        for job_id, item in confirmed.items():
            key = (job_id, item["attempt"])
            self._cancel_known[key] = item["cancel_requested"]
            self._renewed_until[key] = sent + session.lease_ttl_s
            entry = self.journal.entries.get(job_id)
            if entry is not None and entry.state == "accepted" and item["state"] == "running":
                # Acked before, the journal's `running` lost in a crash: an ack now would renew
                # nothing (a repeated ack is answered as before), so none is sent; the lease
                # is the one this reconciliation renewed.
                entry.state, entry.started_at_ms = "running", self._now_ms()
                self._save_later(entry)
        for job_id, entry in list(self.journal.entries.items()):
            if job_id in confirmed:
                continue
            self.journal.drop(job_id)
            task = self._running.pop(job_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()  # (the current task is a supervisor renewing the session: its
                # `_settle` sees its entry gone and gives up, as it must go on to set
                # `_session_ok`)
            elif entry.process is not None:  # left behind by a previous Run process
                await asyncio.to_thread(stop_left_behind, entry.process, self.config.cancel_grace_s)
            log.info(
                "journal entry dropped",
                extra={"fields": {"job_id": job_id, "attempt": entry.attempt}},
            )
        await self.journal.sync()
        for job_id in confirmed:
            if job_id not in self._running and job_id in self.journal.entries:
                self._start(self.journal.entries[job_id], resumed=True)

    # -- control channel -------------------------------------------------------------------

    def heartbeat_pause(self, interval_s: float, *, first: bool) -> float:
        """The pause before a heartbeat: the first at a random phase within the interval, then
        the interval give or take a tenth, so that Runs started together (a fleet rebooted at
        once) spread their heartbeats over the interval and do not fall back in step."""
        if first:
            return interval_s * self.config.draw()
        return jittered(interval_s, HEARTBEAT_JITTER, self.config.draw)

    def claim_wait_s(self) -> float:
        """How long the next claim waits at the platform (jittered: claims answered together,
        by a restarted platform say, do not come back together)."""
        return jittered(self.config.claim_wait_s, CLAIM_WAIT_JITTER, self.config.draw)

    async def _control_loop(self) -> None:
        lost_contact = False
        lost_generation: int | None = None
        first = True
        while not self._stop.is_set():
            session = self.client.session
            interval = session.heartbeat_interval_s if session else 1.0
            pause = 1.0 if lost_contact else self.heartbeat_pause(interval, first=first)
            first = False
            await self._pause(pause)
            if self._stop.is_set():
                return
            try:
                await self.client.heartbeat()
            except SESSION_ERRORS:
                await self._renew_session(session.generation if session else None)
                continue
            except TRANSIENT as error:
                log.warning("heartbeat failed", extra={"fields": {"code": error.code}})
                if not lost_contact:
                    lost_contact = True
                    lost_generation = session.generation if session else None
                continue
            except MoonrunError as error:
                log.warning("heartbeat refused", extra={"fields": {"code": error.code}})
                continue
            if lost_contact:
                # The platform may have restarted: register and reconcile so that both sides
                # agree on every attempt before going on (unless that happened meanwhile).
                lost_contact = False
                await self._renew_session(lost_generation)

    # -- jobs channel ------------------------------------------------------------------------

    async def _jobs_loop(self) -> None:
        """Claim while there is room, always as a long poll (the platform answers at once when
        it has work, and an idle Run's claim is answered the moment a job comes). One claim at
        a time."""
        delays = self.config.backoff.delays()
        while not self._stop.is_set() and not self._draining.is_set():
            if not self._session_ok.is_set():
                await self._until(self._session_ok)
                continue
            free = self.config.capacity - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await self._until(self._slot_freed)
                continue
            generation, asked = self._generation(), time.monotonic()
            try:
                granted = await self._claim(free)
            except SESSION_ERRORS:
                await self._renew_session(generation)
                continue
            except MoonrunError as error:
                log.warning("claim failed", extra={"fields": {"code": error.code}})
                await self._pause(pause_after(error, delays))
                continue
            delays = self.config.backoff.delays()
            if granted:
                await self._accept(granted)
            elif time.monotonic() - asked < self.config.claim_interval_s:
                # Nothing, and at once although asked to wait: a platform that does not hold
                # claims. Poll then, rather than claim in a tight loop.
                await self._pause(self.config.claim_interval_s)

    async def _cancels_loop(self) -> None:
        """While handlers run, keep one long poll open for their cancel intents, so that a
        user's cancel reaches the handler at once rather than at the attempt's next renewal
        (up to lease_ttl/4 later). A platform without the route leaves renewals to tell."""
        delays = self.config.backoff.delays()
        while not self._stop.is_set():
            if not self._contexts:
                self._handler_started.clear()
                await self._until(self._handler_started)
                continue
            if not self._session_ok.is_set():
                await self._until(self._session_ok)
                continue
            known = [key for key, context in self._contexts.items() if context.cancelled.is_set()]
            generation = self._generation()
            try:
                # Given up once no handler has run for a moment: left waiting, it would hold a
                # connection and a place among the platform's waiting claims to the end of its
                # wait. Not at once: short jobs leave no handler running for a few milliseconds
                # between one and the next, and a watch given up and asked again each time cost
                # 9% of the peer bench's throughput (a new connection each).
                cancels = await self._until_stopped(
                    self.client.watch_cancels(known, self.claim_wait_s()), self._idle_handlers()
                )
            except SESSION_ERRORS:
                await self._renew_session(generation)
                continue
            except (NotFound, MethodNotAllowed):
                log.info("the platform does not announce cancels; renewals will tell")
                return
            except MoonrunError as error:
                await self._pause(pause_after(error, delays))
                continue
            delays = self.config.backoff.delays()
            for key in cancels or ():
                context = self._contexts.get(key)
                if context is not None:
                    context.cancelled.set()

    async def _idle_handlers(self) -> None:
        """Returns once no handler has run for WATCH_IDLE_S."""
        while True:
            await self._no_handler.wait()
            await asyncio.sleep(WATCH_IDLE_S)
            if self._no_handler.is_set():
                return

    async def _until_stopped(self, call: Awaitable[T], *also: Awaitable[object]) -> T | None:
        """`call`'s answer, or None when Run stops (or one of `also` returns) first (the call
        is abandoned)."""
        answer = asyncio.ensure_future(call)
        others = [asyncio.ensure_future(self._stop.wait()), *map(asyncio.ensure_future, also)]
        try:
            await asyncio.wait({answer, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for other in others:
                other.cancel()
            if not answer.done():
                answer.cancel()
        return answer.result() if answer.done() and not answer.cancelled() else None

    async def _claim(self, free: int) -> list[Grant]:
        """Claim up to `free` jobs, waiting at the platform for some; nothing if Run stops
        first."""
        claim = asyncio.ensure_future(self.client.claim(free, self.claim_wait_s()))
        stopping = asyncio.ensure_future(self._stop.wait())
        draining = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait({claim, stopping, draining}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            draining.cancel()
            if not claim.done():  # abandoned: whatever it might still grant waits for its
                claim.cancel()  # ack deadline, as for any Run that stops
        return claim.result() if claim.done() else []

    async def _accept(self, granted: list[Grant]) -> None:
        """Journal every granted attempt (durably) before acking any of them."""
        entries = [
            Assignment(
                job_id=job["job_id"],
                attempt=job["attempt"],
                lease=job["lease"],
                kind=job["kind"],
                payload=job["payload"],
                server_id=job["server_id"],
                owner_id=self._owner_of(job),
            )
            for job in granted
        ]
        await self.journal.put(*entries)
        for entry in entries:
            log.info(
                "claimed", extra={"fields": {"job_id": entry.job_id, "attempt": entry.attempt}}
            )
            self._start(entry, resumed=False)

    async def _send_results(
        self, batch: list[dict[str, Any]]
    ) -> Sequence[ResultAnswer | MoonrunError]:
        """A batch of results, and with it a claim of the places they free when the platform
        grants with results (docs/protocol.md, "Claims with results"): the next jobs come in
        the results' answer, one round trip sooner. Its grants are journaled and started
        before any result's sender hears its answer (and leaves its place)."""
        session = self.client.session
        claiming = (
            session is not None
            and session.claims_with_results
            and self._session_ok.is_set()
            and not self._draining.is_set()
            and not self._stop.is_set()
        )
        if not claiming:
            return await self.client.results(batch)
        answers, granted = await self.client.results_and_claim(batch, len(batch))
        if granted:
            await self._accept(granted)
        return answers

    def _owner_of(self, job: Grant) -> str | None:
        """The grant's `owner_id`; a platform older than this Run sends none (said once)."""
        owner = job.get("owner_id")
        if owner:
            return owner
        if self.config.owner_uids and not self._owner_missing_said:
            self._owner_missing_said = True
            log.warning(
                "the platform does not say who owns each job: commands of jobs that name no "
                "owner share one uid (upgrade the platform)"
            )
        return None

    def _start(self, entry: Assignment, *, resumed: bool) -> None:
        self._running[entry.job_id] = asyncio.create_task(self._supervise(entry, resumed))

    async def _supervise(self, entry: Assignment, resumed: bool) -> None:
        """Everything about one held attempt, from ack to an accepted result."""
        try:
            if entry.state == "accepted" and not await self._ack(entry):
                self._forget(entry)
                return
            if entry.state == "running":
                result = await self._execute(entry, resumed)
                if result is None:
                    return
                entry.state, entry.result = "finished", result.as_message()
                if self._silent(entry, resumed):
                    # It printed nothing: its result says so, and no log batch goes for it.
                    entry.result["silent"] = True
                else:
                    # Its handler is done: no line comes after these, and the platform is
                    # told so.
                    self.logs.finish(Attempt(entry.job_id, entry.attempt, entry.lease))
                await self._save(entry)
            if entry.state == "finished":
                await self._deliver(entry)
        except asyncio.CancelledError:
            pass  # Run stops, or reconcile dropped the attempt: the journal says what to do
        finally:
            if self._running.get(entry.job_id) is asyncio.current_task():
                del self._running[entry.job_id]
            self._renewed_until.pop((entry.job_id, entry.attempt), None)
            self._cancel_known.pop((entry.job_id, entry.attempt), None)
            self._spoke.discard((entry.job_id, entry.attempt))
            self._slot_freed.set()

    def _silent(self, entry: Assignment, resumed: bool) -> bool:
        """Whether the attempt's result may say it printed no log line (docs/protocol.md,
        "Silent attempts"): this process ran it from its start, it printed none, and the
        platform takes the word (an older one would wait out the transfer grace for want of
        a last batch)."""
        session = self.client.session
        return (
            not resumed
            and (entry.job_id, entry.attempt) not in self._spoke
            and session is not None
            and session.silent_results
        )

    def _forget(self, entry: Assignment) -> None:
        """Drop the attempt from the journal, without waiting for the disk: should the drop be
        lost, the next reconciliation discards the entry."""
        if self.journal.entries.get(entry.job_id) is entry:
            self.journal.drop(entry.job_id)

    async def _settle(
        self, entry: Assignment, what: str, send: Callable[[], Awaitable[Any]]
    ) -> float | None:
        """Send until accepted; returns when (monotonic) the *first* request was sent: an
        earlier copy may be the one the platform applied, its answer lost (for an ack, the
        lease runs from then; a repeated ack renews nothing).

        Session errors renew the session first; transient ones back off. None: refused for
        good, dropped by a reconciliation meanwhile, or Run is stopping.
        """
        delays = self.config.backoff.delays()
        first: float | None = None
        while not self._stop.is_set():
            generation, sent = self._generation(), time.monotonic()
            first = sent if first is None else first
            try:
                await send()
                return first
            except SESSION_ERRORS:
                await self._renew_session(generation)
                if self.journal.entries.get(entry.job_id) is not entry:
                    return None
            except TRANSIENT as error:
                await self._pause(pause_after(error, delays))
            except MoonrunError as error:
                fields = {"job_id": entry.job_id, "code": error.code}
                log.info(f"{what} refused", extra={"fields": fields})
                return None
        return None

    async def _ack(self, entry: Assignment) -> bool:
        """True once the ack is accepted; False when the attempt is gone for good."""
        ack = {"job_id": entry.job_id, "attempt": entry.attempt, "lease": entry.lease}
        key = (entry.job_id, entry.attempt)

        async def send() -> None:
            answer = await self._acks.submit(ack)
            cancel_requested = answer.get("cancel_requested")
            if cancel_requested is not None:  # a platform older than this Run says nothing
                self._cancel_known[key] = cancel_requested

        sent = await self._settle(entry, "ack", send)
        session = self.client.session
        if sent is None or session is None:
            return False
        self._renewed_until[key] = sent + session.lease_ttl_s
        entry.state, entry.started_at_ms = "running", self._now_ms()
        # Not waited for, and written only if the handler is still at work a little later: a
        # quick handler's result write carries it (one fsync, not two, between the ack and
        # the result). Lost in a crash, the attempt is acked again on restart (the platform
        # answers a repeated ack as before) and resumed.
        asyncio.get_running_loop().call_later(RUNNING_WRITE_DELAY_S, self._save_if_running, entry)
        return True

    async def _execute(self, entry: Assignment, resumed: bool) -> HandlerResult | None:
        """Run the handler under lease renewals; None when the attempt was given up."""
        handler = self.handlers.get(entry.kind)
        if handler is None:
            return HandlerResult.failed("unknown_kind", f"this Run has no handler for {entry.kind}")
        if resumed and not handler.resumable:
            await self._stop_left_behind(entry)
            return HandlerResult.failed(
                "run_restarted", "Run restarted and this kind cannot resume", retryable=True
            )
        # Every handler may count on a payload that fits the schema it declares (a plugin's
        # too); the platform checked it at submit only if this Run had advertised it then.
        attempt = Attempt(entry.job_id, entry.attempt, entry.lease)

        def say(stream: str, text: str) -> None:
            self._spoke.add((entry.job_id, entry.attempt))
            self.logs.add(attempt, stream, text)

        if refused := refuse_payload(self._checkers[entry.kind], entry.payload):
            # Said in the job's logs too: nothing of the job ran, and its log says why.
            message = refused.error["message"] if refused.error else "bad payload"
            say("stderr", f"moonrun: payload refused: {message}")
            return refused
        context = JobContext(
            job_id=entry.job_id,
            attempt=entry.attempt,
            kind=entry.kind,
            payload=entry.payload,
            started_at_ms=entry.started_at_ms or self._now_ms(),
            now_ms=self._now_ms,
            log_line=say,
            upload=lambda source, name: self.artifacts.add(attempt, source, name),
            remember_process=lambda record: self._remember_process(entry, record),
            grace_s=self.config.cancel_grace_s,
            owner_id=entry.owner_id,
        )
        known = self._cancel_known.pop((entry.job_id, entry.attempt), None)
        if known is None:  # from a platform that does not say so with the ack
            with contextlib.suppress(MoonrunError):
                answer = await self.client.cancel_poll(entry.job_id, entry.attempt, entry.lease)
                known = answer["cancel_requested"]
        if known:
            context.cancelled.set()
        if not self._lease_lasts_a_tick(entry):
            # The ack or the cancel poll took so long that the lease may lapse before the
            # first renewal could land: the handler must not start on it.
            await self._self_fence(entry)
            return None
        work = asyncio.create_task(handler.run(context))
        key = (entry.job_id, entry.attempt)
        self._contexts[key] = context
        self._no_handler.clear()
        self._handler_started.set()
        try:
            if not await self._renew_while(work, entry, context):
                return None
        finally:
            if self._contexts.get(key) is context:
                del self._contexts[key]
                if not self._contexts:
                    self._no_handler.set()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
        try:
            return work.result().bounded()
        except Exception as error:  # a handler bug fails the attempt, not Run
            return HandlerResult.failed("handler_error", type(error).__name__, retryable=True)

    async def _remember_process(self, entry: Assignment, record: int | dict[str, Any]) -> None:
        entry.process = record if isinstance(record, dict) else process_record(record)
        await self._save(entry)

    async def _stop_left_behind(self, entry: Assignment) -> None:
        """Stop what a previous Run process started for this attempt."""
        if entry.process is not None:
            await asyncio.to_thread(stop_left_behind, entry.process, self.config.cancel_grace_s)
            entry.process = None
            await self._save(entry)

    async def _renew_while(
        self, work: asyncio.Task[HandlerResult], entry: Assignment, context: JobContext
    ) -> bool:
        """Renew the lease every lease_ttl/4 until `work` is done; False when Run gave up."""
        session = self.client.session
        assert session is not None
        tick, margin = session.lease_ttl_s / 4, session.lease_ttl_s / 8
        while True:
            done, _ = await asyncio.wait({work}, timeout=tick)
            if work in done:
                return True
            entry.progress_seq += 1
            await self._save(entry)  # before sending: a restart never reuses a seq the platform saw
            generation, sent = self._generation(), time.monotonic()
            # A renewal is only worth waiting for while the lease it renews still holds.
            key = (entry.job_id, entry.attempt)
            budget = self._renewed_until.get(key, 0.0) - margin - sent
            try:
                if budget <= 0:
                    raise TimeoutError
                answer = await asyncio.wait_for(
                    self.client.progress(
                        entry.job_id,
                        entry.attempt,
                        entry.lease,
                        entry.progress_seq,
                        context.percent,
                        context.message,
                    ),
                    timeout=budget,
                )
                lease_ttl = self.client.session.lease_ttl_s if self.client.session else 0
                self._renewed_until[key] = sent + lease_ttl
                if answer["cancel_requested"]:
                    context.cancelled.set()
            except SESSION_ERRORS:
                renewal = asyncio.create_task(self._renew_session(generation))
                self._background.add(renewal)  # keep a reference until it is done
                renewal.add_done_callback(self._background.discard)
            except SequenceRegression:
                entry.progress_seq += 1000
            except TRANSIENT:
                pass
            except TimeoutError:
                pass  # no answer in time: the check below decides whether to go on
            except MoonrunError as error:  # the platform gave the attempt away
                log.info(
                    "attempt ended by the platform",
                    extra={"fields": {"job_id": entry.job_id, "code": error.code}},
                )
                self._forget(entry)
                return False
            if not self._lease_lasts_a_tick(entry):
                await self._self_fence(entry)
                return False

    def _lease_lasts_a_tick(self, entry: Assignment) -> bool:
        """Whether the attempt's lease surely holds until another renewal, sent a tick
        (lease_ttl/4) from now, could land (lease_ttl/8 before the lease ends)."""
        session = self.client.session
        if session is None:
            return False
        tick, margin = session.lease_ttl_s / 4, session.lease_ttl_s / 8
        renewed_until = self._renewed_until.get((entry.job_id, entry.attempt), 0.0)
        return time.monotonic() + tick < renewed_until - margin

    async def _self_fence(self, entry: Assignment) -> None:
        """Stop an attempt whose lease may lapse before another renewal could be accepted.

        Its journal entry says so until the lease has surely lapsed at the platform (one
        lease TTL from now: every renewal it accepted was answered before now), then goes,
        whether or not a reconciliation came meanwhile: a Run whose session never breaks
        would otherwise keep every attempt it ever self-fenced.
        """
        self.self_fenced += 1
        entry.state = "self_fenced"
        await self._save(entry)
        session = self.client.session
        lapsed_s = session.lease_ttl_s if session is not None else 0.0
        asyncio.get_running_loop().call_later(lapsed_s, self._forget, entry)
        log.warning(
            "attempt self-fenced: no lease renewal accepted in time",
            extra={"fields": {"job_id": entry.job_id, "attempt": entry.attempt}},
        )

    async def _deliver(self, entry: Assignment) -> None:
        """Send the result until it is accepted or refused for good (same fingerprint)."""
        result = entry.result
        assert result is not None
        message = {"job_id": entry.job_id, "attempt": entry.attempt, "lease": entry.lease, **result}
        sent = await self._settle(entry, "result", lambda: self._results.submit(message))
        if sent is None and self._stop.is_set():
            return  # the journal keeps the result for the next start
        if sent is not None:
            fields = {"job_id": entry.job_id, "outcome": result.get("outcome")}
            log.info("result accepted", extra={"fields": fields})
        self._forget(entry)
