"""Run's job messages (ack, progress, cancel-poll, result): fencing checks and their effects.

Each function takes the stored record and returns a `Decision`: the record to store (the same
object when nothing changes), and either an answer or the rejection. A rejection never changes
the record, except that a deadline that had already passed is applied (as the sweeper would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from moonrun.errors import (
    AckDeadlineExpired,
    InvalidRequest,
    JobRejected,
    LeaseExpired,
    LeaseMismatch,
    NoCancelIntent,
    NotActive,
    ReconcileRequired,
    SequenceRegression,
    StaleAttempt,
    TerminalConflict,
    WrongEndpoint,
)
from moonrun.scheduling.fingerprint import token_matches
from moonrun.scheduling.jobs import (
    TEXT_LIMIT,
    AttemptSummary,
    Event,
    Failure,
    FailureReason,
    Job,
    JobState,
    Outcome,
    Progress,
    RecordedResult,
    RunResult,
    accepts,
    apply_due_deadline,
    end_attempt,
    finish,
    transition,
)
from moonrun.scheduling.time import Instant

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated sender of a Run message: its endpoint and session generation."""

    endpoint_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class Evidence:
    """The attempt evidence every job message carries."""

    attempt: int
    lease: str


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """What a message does: the record to store, and an answer or a rejection."""

    job: Job
    answer: T | None = None
    error: JobRejected | None = None


@dataclass(frozen=True, slots=True)
class AckAnswer:
    state: JobState
    lease_expires_at: Instant
    cancel_requested: bool = False
    """Whether a cancel intent exists: Run learns it with the ack, without a cancel poll."""


@dataclass(frozen=True, slots=True)
class ProgressAnswer:
    lease_expires_at: Instant
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class CancelPollAnswer:
    cancel_requested: bool
    requested_at: Instant | None


@dataclass(frozen=True, slots=True)
class ResultAnswer:
    state: JobState
    attempt: int
    fingerprint: str
    next_eligible_at: Instant | None
    replayed: bool


def fence(job: Job, caller: Caller, evidence: Evidence) -> JobRejected | None:
    """The evidence checks, in order (docs/protocol.md, "Fencing and deadlines"); `None`: all pass.

    `job` already has any passed deadline applied, so an attempt that ended by a deadline is
    recognised by its recorded failure whether the sweeper or this message applied it. The
    generation binding only guards active attempts: replays of a recorded result need none.
    """
    if job.endpoint_id != caller.endpoint_id:
        return WrongEndpoint()
    if evidence.attempt != job.attempt:
        return StaleAttempt(f"attempt {evidence.attempt} is not the current attempt {job.attempt}")
    if not token_matches(evidence.lease, job.lease_hash):
        return LeaseMismatch()
    if job.state.is_active and job.session_generation != caller.generation:
        return ReconcileRequired()
    failure = job.last_failure
    if failure is not None and failure.attempt == job.attempt:
        if failure.reason is FailureReason.ACK_TIMEOUT:
            return AckDeadlineExpired()
        if failure.reason is FailureReason.LEASE_EXPIRED:
            return LeaseExpired()
    return None


def _checked(
    job: Job, caller: Caller, evidence: Evidence, now: Instant, draw: float
) -> Decision[T]:
    current = apply_due_deadline(job, now=now, draw=draw)
    return Decision(current, error=fence(current, caller, evidence))


def ack(
    job: Job, caller: Caller, evidence: Evidence, *, now: Instant, lease_ttl_ms: int, draw: float
) -> Decision[AckAnswer]:
    """accepted -> running; a repeated ack of the same attempt gets the same answer."""
    checked: Decision[AckAnswer] = _checked(job, caller, evidence, now, draw)
    current = checked.job
    if checked.error is not None:
        return checked
    if current.state is JobState.RUNNING:
        assert current.lease_expires_at is not None
        answer = AckAnswer(JobState.RUNNING, current.lease_expires_at, current.cancel is not None)
        return Decision(current, answer)
    if not accepts(Event.ACK, current.state):
        return Decision(current, error=NotActive(f"the job is {current.state}"))
    expires = now + lease_ttl_ms
    acked = transition(
        current, Event.ACK, JobState.RUNNING, now, ack_deadline=None, lease_expires_at=expires
    )
    return Decision(acked, AckAnswer(JobState.RUNNING, expires, acked.cancel is not None))


def progress(
    job: Job,
    caller: Caller,
    evidence: Evidence,
    *,
    seq: int,
    percent: float | None,
    message: str | None,
    now: Instant,
    lease_ttl_ms: int,
    draw: float,
) -> Decision[ProgressAnswer]:
    """Record progress and renew the execution lease; `seq` strictly increases per attempt."""
    _check_progress(seq, percent, message)
    checked: Decision[ProgressAnswer] = _checked(job, caller, evidence, now, draw)
    current = checked.job
    if checked.error is not None:
        return checked
    if not accepts(Event.PROGRESS, current.state):
        return Decision(current, error=NotActive(f"the job is {current.state}"))
    last = current.progress
    cancel_requested = current.cancel is not None
    if last is not None and seq == last.seq:
        assert current.lease_expires_at is not None
        return Decision(current, ProgressAnswer(current.lease_expires_at, cancel_requested))
    if last is not None and seq < last.seq:
        return Decision(
            current, error=SequenceRegression(f"seq {seq} is below the last seq {last.seq}")
        )
    expires = now + lease_ttl_ms
    renewed = transition(
        current,
        Event.PROGRESS,
        JobState.RUNNING,
        now,
        progress=Progress(
            seq=seq, percent=None if percent is None else float(percent), message=message, at=now
        ),
        lease_expires_at=expires,
    )
    return Decision(renewed, ProgressAnswer(expires, cancel_requested))


def _check_progress(seq: int, percent: float | None, message: str | None) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**53:
        raise InvalidRequest("seq must be a non-negative integer")
    if percent is not None and (
        isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100
    ):
        raise InvalidRequest("percent must be a number from 0 to 100")
    if message is not None and (not isinstance(message, str) or len(message) > TEXT_LIMIT):
        raise InvalidRequest(f"message must be a string of at most {TEXT_LIMIT} characters")


def cancel_poll(
    job: Job, caller: Caller, evidence: Evidence, *, now: Instant, draw: float
) -> Decision[CancelPollAnswer]:
    """Tell the fenced active attempt whether a cancel intent exists."""
    checked: Decision[CancelPollAnswer] = _checked(job, caller, evidence, now, draw)
    current = checked.job
    if checked.error is not None:
        return checked
    if not accepts(Event.CANCEL_POLL, current.state):
        return Decision(current, error=NotActive(f"the job is {current.state}"))
    intent = current.cancel
    return Decision(
        current, CancelPollAnswer(intent is not None, intent.requested_at if intent else None)
    )


def result(
    job: Job,
    caller: Caller,
    evidence: Evidence,
    reported: RunResult,
    *,
    now: Instant,
    draw: float,
    silent: bool = False,
) -> Decision[ResultAnswer]:
    """Record the attempt's result; a replay of the recorded one gets the stored answer.
    `silent`: Run says the attempt printed no log line (kept in its history: its logs are
    complete; not part of the terminal fingerprint, which is the result's)."""
    checked: Decision[ResultAnswer] = _checked(job, caller, evidence, now, draw)
    current = checked.job
    if checked.error is not None:
        return checked
    if current.state is JobState.RETRYING or current.state.is_terminal:
        return Decision(current, *_replay(current, reported))
    if not accepts(Event.RESULT, current.state):
        return Decision(current, error=NotActive(f"the job is {current.state}; ack first"))
    if reported.outcome is Outcome.CANCELLED and current.cancel is None:
        return Decision(current, error=NoCancelIntent())
    recorded = RecordedResult(attempt=current.attempt, result=reported, at=now)
    ended = _apply_result(current, recorded, now=now, draw=draw, silent=silent)
    return Decision(ended, _answer(ended, reported.fingerprint, replayed=False))


def _replay(job: Job, reported: RunResult) -> tuple[ResultAnswer | None, JobRejected | None]:
    recorded = job.result
    if recorded is not None and recorded.attempt == job.attempt:
        if recorded.result.fingerprint == reported.fingerprint:
            return _answer(job, reported.fingerprint, replayed=True), None
        return None, TerminalConflict()
    if job.state.is_terminal:
        return None, TerminalConflict("the job ended without a result from this attempt")
    return None, NotActive(f"the job is {job.state}")


def _apply_result(
    job: Job, recorded: RecordedResult, *, now: Instant, draw: float, silent: bool
) -> Job:
    reported = recorded.result
    if reported.outcome is Outcome.FAILED:
        error = reported.error
        failure = Failure(
            FailureReason.FAILED,
            job.attempt,
            now,
            error.code if error else None,
            error.message if error else None,
        )
        return end_attempt(
            job,
            Event.RESULT,
            failure,
            now=now,
            draw=draw,
            retryable=reported.retryable,
            result=recorded,
            silent=silent,
        )
    summary = AttemptSummary(
        job.attempt, job.claimed_at, now, reported.outcome.value, silent=silent
    )
    return finish(
        job,
        Event.RESULT,
        reported.outcome,
        now,
        error=reported.error,
        result=recorded,
        history=(*job.history, summary),
        lease_expires_at=None,
    )


def _answer(job: Job, fingerprint: str, *, replayed: bool) -> ResultAnswer:
    next_eligible_at = job.eligible_at if job.state is JobState.RETRYING else None
    return ResultAnswer(job.state, job.attempt, fingerprint, next_eligible_at, replayed)
