"""Reconciliation: what to do with Run's journal entries and with active work it left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from moonrun.scheduling.fingerprint import token_matches
from moonrun.scheduling.jobs import (
    Event,
    FailureReason,
    Job,
    JobState,
    ReconcileMark,
    ReconcileOutcome,
    end_attempt,
    platform_failure,
    transition,
)
from moonrun.scheduling.messages import Caller
from moonrun.scheduling.time import Instant


class DiscardReason(StrEnum):
    """Why Run must drop a journal entry (the first that applies, in this order)."""

    UNKNOWN = "unknown"
    WRONG_ENDPOINT = "wrong_endpoint"
    TERMINAL = "terminal"
    WRONG_ATTEMPT = "wrong_attempt"
    WRONG_LEASE = "wrong_lease"
    NOT_ACTIVE = "not_active"


@dataclass(frozen=True, slots=True)
class ReconcileEntry:
    """One active assignment from Run's journal."""

    job_id: str
    attempt: int
    lease: str


@dataclass(frozen=True, slots=True)
class Discard:
    job_id: str
    attempt: int
    reason: DiscardReason


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    """Which entries to confirm, which to discard, and which active jobs Run has lost."""

    confirm: tuple[str, ...]
    discard: tuple[Discard, ...]
    lost: tuple[str, ...]


def classify(entry: ReconcileEntry, job: Job | None, endpoint_id: str) -> DiscardReason | None:
    """`None` when the entry matches the job's live attempt, else why to discard it."""
    if job is None:
        return DiscardReason.UNKNOWN
    if job.endpoint_id != endpoint_id:
        return DiscardReason.WRONG_ENDPOINT
    if job.state.is_terminal:
        return DiscardReason.TERMINAL
    if entry.attempt != job.attempt:
        return DiscardReason.WRONG_ATTEMPT
    if not token_matches(entry.lease, job.lease_hash):
        return DiscardReason.WRONG_LEASE
    if not job.state.is_active:
        return DiscardReason.NOT_ACTIVE
    return None


def plan(
    entries: Sequence[ReconcileEntry],
    jobs: Mapping[str, Job],
    active: Sequence[Job],
    endpoint_id: str,
    *,
    generation: int,
) -> ReconcilePlan:
    """Plan a reconciliation over records whose passed deadlines are already applied.

    `jobs` holds the records of the entries' job ids that exist; `active` the endpoint's
    `accepted`/`running` jobs. Every active job that no entry confirms is lost, unless it is
    bound to the reconciling session's own `generation`: that session claimed or confirmed
    it after it registered, so a report it sent before (a retried or replayed copy of its
    reconciliation) cannot speak for it.
    """
    confirm: list[str] = []
    discard: list[Discard] = []
    for entry in entries:
        reason = classify(entry, jobs.get(entry.job_id), endpoint_id)
        if reason is None:
            confirm.append(entry.job_id)
        else:
            discard.append(Discard(entry.job_id, entry.attempt, reason))
    confirmed = set(confirm)
    lost = tuple(
        job.id
        for job in active
        if job.id not in confirmed and (job.session_generation or 0) < generation
    )
    return ReconcilePlan(tuple(confirm), tuple(discard), lost)


def confirm(
    job: Job, caller: Caller, *, now: Instant, ack_timeout_ms: int, lease_ttl_ms: int
) -> Job:
    """Rebind a matching active attempt to the caller's generation and renew its deadline."""
    mark = ReconcileMark(ReconcileOutcome.CONFIRMED, now, caller.generation)
    renewed = (
        {"ack_deadline": now + ack_timeout_ms}
        if job.state is JobState.ACCEPTED
        else {"lease_expires_at": now + lease_ttl_ms}
    )
    return transition(
        job,
        Event.RECONCILE_CONFIRM,
        job.state,
        now,
        session_generation=caller.generation,
        reconcile=mark,
        **renewed,
    )


def lose(job: Job, caller: Caller, *, now: Instant, draw: float) -> Job:
    """Apply cancel or retry policy to an active attempt that Run's report did not confirm."""
    failure = platform_failure(FailureReason.RECONCILE_LOST, job.attempt, now)
    marked = replace(job, reconcile=ReconcileMark(ReconcileOutcome.LOST, now, caller.generation))
    return end_attempt(marked, Event.RECONCILE_LOST, failure, now=now, draw=draw)
