"""What SchedulingService answers: plain values for the HTTP layer and for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from moonrun.scheduling import reconcile as reconcile_domain
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.reconcile import Discard
from moonrun.scheduling.records import Endpoint, Session
from moonrun.scheduling.time import Instant


@dataclass(frozen=True, slots=True)
class EnrolledEndpoint:
    """A new endpoint and its one-time join token (returned once, never stored raw)."""

    endpoint: Endpoint
    join_token: str
    join_token_expires_at: Instant


@dataclass(frozen=True, slots=True)
class Registration:
    """A new session; the HTTP layer derives the session key from `session.id`."""

    session: Session
    heartbeat_interval_s: float
    session_ttl_s: float
    ack_timeout_s: float
    lease_ttl_s: float


@dataclass(frozen=True, slots=True)
class Heartbeat:
    session_expires_at: Instant
    server_time: Instant
    heartbeat_interval_s: float
    """The interval to heartbeat at from now on (stretched with the fleet)."""


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """One granted attempt; `lease` is the raw token, handed out here and nowhere else."""

    job_id: str
    server_id: str
    owner_id: str
    """Whose job it is (the user who owned its server when it was made), so that Run can
    keep owners apart."""
    kind: str
    payload_json: str
    """The payload as stored, handed on verbatim: the claim never decodes and re-encodes what
    it granted, so nothing about a payload can fail its answer after the claim committed."""
    attempt: int
    lease: str
    ack_deadline: Instant
    lease_ttl_s: float
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Confirmed:
    job_id: str
    attempt: int
    state: JobState
    cancel_requested: bool
    deadline: Instant


@dataclass(frozen=True, slots=True)
class Lost:
    job_id: str
    attempt: int
    state: JobState


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    confirmed: tuple[Confirmed, ...]
    discard: tuple[Discard, ...]
    lost: tuple[Lost, ...]


@dataclass
class ReportBuilder:
    confirmed: list[Confirmed] = field(default_factory=list)
    discard: list[Discard] = field(default_factory=list)
    lost: list[Lost] = field(default_factory=list)
    decided: set[str] = field(default_factory=set)

    def add(self, plan: reconcile_domain.ReconcilePlan, job: Job | None) -> None:
        self.discard.extend(plan.discard)
        if job is None:
            return
        if plan.confirm:
            assert job.deadline_at is not None
            self.confirmed.append(
                Confirmed(job.id, job.attempt, job.state, job.cancel is not None, job.deadline_at)
            )
        if plan.lost:
            self.lost.append(Lost(job.id, job.attempt, job.state))
        self.decided.add(job.id)

    def build(self) -> ReconcileReport:
        return ReconcileReport(tuple(self.confirmed), tuple(self.discard), tuple(self.lost))


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    job: Job
    waits_on_run: bool
    """True while only Run can resolve the intent (the API answers 202)."""
    had_ended: bool = False
    """The job had ended before the cancel, which left it as it was."""


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: tuple[Job, ...]
    next_cursor: str | None
