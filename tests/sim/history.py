"""What a simulation records for the checker: every job write the store committed (and which
request caused it), every answer the platform gave, what each Run worked on and when, and
what the store held after each platform restart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moonrun.scheduling.jobs import Job
from moonrun.service.config import SchedulingSettings


@dataclass(frozen=True)
class Cause:
    """The platform call during which a write was made (or an answer given)."""

    call: int
    kind: str
    """The service method: `claim`, `ack_many`, `progress`, `cancel_poll`, `result_many`,
    `reconcile`, `register_session`, `heartbeat`, `create_job`, `create_jobs`, `cancel_job`,
    `get_job`, `sweep`, `fire_due` (a firing pass of the schedules), `prune` (the sweeper's
    retention pass), `delete_job`."""
    instance: int
    sender: str
    session_id: str | None = None
    entries: Mapping[str, Any] = field(default_factory=dict)
    """What the request said about each job: its evidence, the result it reports."""


@dataclass(frozen=True)
class Write:
    """A job record the store said it committed."""

    at: int
    cause: Cause | None
    before: Job | None
    after: Job


@dataclass(frozen=True)
class Deletion:
    """A job the store said it deleted (retention's prune, or a user's delete), as it was
    stored; `writes` and `answers` say how many of each had been recorded before it."""

    at: int
    cause: Cause | None
    job: Job
    writes: int
    answers: int


@dataclass(frozen=True)
class GivenAnswer:
    """One answer the platform gave (for one job, or for the whole call when `job_id` is None):
    the answer value, or the `MoonrunError` it refused with."""

    at: int
    cause: Cause
    job_id: str | None
    value: Any


@dataclass
class Work:
    """A Run process worked on an attempt (its handler ran) from `start` to `end`."""

    run: str
    boot: str
    job_id: str
    attempt: int
    start: int
    end: int | None = None
    why: str | None = None
    """Why the work stopped: `finished`, `cancelled`, `self_fenced`, `refused`, `dropped`,
    `crashed`, `superseded`."""

    def stop(self, at: int, why: str) -> None:
        if self.end is None:
            self.end, self.why = at, why


@dataclass(frozen=True)
class Belief:
    """At `at`, a Run process came to believe it may work on an attempt until `until` (true
    time): its renewed_until less the self-fencing margin, on its own clock."""

    run: str
    boot: str
    job_id: str
    attempt: int
    at: int
    until: int


@dataclass(frozen=True)
class Snapshot:
    """What a freshly (re)opened store held for every job, right after a platform restart."""

    at: int
    instance: int
    jobs: Mapping[str, Job | None]
    writes: int
    """How many writes had been committed when it was taken (`History.writes[:writes]`)."""
    answers: int
    """How many answers had been given (`History.answers[:answers]`)."""
    final: bool = False
    deletions: int = 0
    """How many deletions had been committed (`History.deletions[:deletions]`)."""


@dataclass
class History:
    settings: SchedulingSettings
    writes: list[Write] = field(default_factory=list)
    answers: list[GivenAnswer] = field(default_factory=list)
    work: list[Work] = field(default_factory=list)
    beliefs: list[Belief] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    sessions: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Session id -> (endpoint id, generation), from the registrations the platform answered."""
    internal_errors: list[tuple[int, Cause, str]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    """Faults injected, by kind (`cut`: messages lost to a partition)."""
    self_fences: int = 0
    started_at: int = 0
    calm_at: int | None = None
    """When faults stopped and every Run was (re)started."""
    liveness_bound_ms: int | None = None
    ended_at: int | None = None
    hit_step_cap: bool = False
    cause: Cause | None = None
    """The call being handled right now (set by the platform around each service call)."""
    latest: dict[str, Job] = field(default_factory=dict)
    """Each job's last committed record."""
    schedules: dict[str, str] = field(default_factory=dict)
    """Schedule id -> its overlap policy (every schedule is `* * * * *`, made at the start)."""
    groups: dict[str, tuple[int | None, dict[str, int], bool]] = field(default_factory=dict)
    """Group id -> (max_parallel, its counts by state, done) as the store answers at the end."""
    up: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    """Per platform instance, the times it was up: (since, until or None while it still is)."""
    deletions: list[Deletion] = field(default_factory=list)
    """Every job deletion the store committed, in order (retention runs in every seed)."""
    gone: set[str] = field(default_factory=set)
    """The ids of the jobs deleted (`deletions`)."""

    def wrote(self, at: int, before: Job | None, after: Job) -> None:
        self.writes.append(Write(at, self.cause, before, after))
        self.latest[after.id] = after

    def deleted(self, at: int, job: Job) -> None:
        self.deletions.append(Deletion(at, self.cause, job, len(self.writes), len(self.answers)))
        self.gone.add(job.id)

    def answered(self, at: int, cause: Cause, job_id: str | None, value: Any) -> None:
        self.answers.append(GivenAnswer(at, cause, job_id, value))

    def job_ids(self) -> list[str]:
        """Every job the store said it inserted, in order."""
        return list(self.latest)
