"""Job states, the job record, the one transition table and the platform-side transitions.

Everything here is pure: records in, records out, `now` passed in. Every change of state goes
through `transition`, which checks `TRANSITIONS` and raises `IllegalTransition` for anything else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Final

from moonrun.errors import IllegalTransition, InvalidRequest
from moonrun.scheduling.fingerprint import JsonValue, Shape, compact_json, result_fingerprint
from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.time import Instant

KIND_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
CODE_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
PAYLOAD_LIMIT: Final = 64 * 1024
PAYLOAD_SHAPE: Final = Shape(max_depth=32, max_members=10_000)
"""A payload nests at most 32 containers deep and holds at most 10,000 keys and items: what
every consumer (the platform's JSON, Run's, a handler's) can walk without running out of stack."""
OUTPUT_LIMIT: Final = 64 * 1024
NOT_BEFORE_HORIZON_MS: Final = 366 * 24 * 3600 * 1000
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 9
DEFAULT_PRIORITY: Final = 5
"""A job's priority: among an endpoint's claimable jobs a higher one is granted first
(docs/protocol.md, "Priorities"; `scheduling/fairness.py`)."""
"""How far ahead a job may be scheduled: a year (a leap year's worth)."""
TEXT_LIMIT: Final = 4096


class JobState(StrEnum):
    """Where a job is in its life; the last three are terminal and never change again."""

    QUEUED = "queued"
    """Waiting for its first claim."""
    ACCEPTED = "accepted"
    """Claimed by Run under a fresh lease; waiting for the ack before the ack deadline."""
    RUNNING = "running"
    """Acked; Run works on it under a renewable execution lease."""
    RETRYING = "retrying"
    """An attempt ended and budget remains; waits for `eligible_at` before the next claim."""
    SUCCEEDED = "succeeded"
    """Terminal: an attempt reported success."""
    FAILED = "failed"
    """Terminal: a non-retryable failure, or the retry budget is spent."""
    CANCELLED = "cancelled"
    """Terminal: a cancel intent was resolved."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """Held by Run under a lease (`accepted` or `running`)."""
        return self in _ACTIVE

    @property
    def is_waiting(self) -> bool:
        """Waiting for a claim (`queued` or `retrying`)."""
        return self in _WAITING


_TERMINAL: Final = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
_ACTIVE: Final = frozenset({JobState.ACCEPTED, JobState.RUNNING})
_WAITING: Final = frozenset({JobState.QUEUED, JobState.RETRYING})


class Event(StrEnum):
    """What happens to a job: a Run message, a user request or a passed deadline."""

    CLAIM = "claim"
    ACK = "ack"
    PROGRESS = "progress"
    CANCEL_POLL = "cancel_poll"
    RESULT = "result"
    ACK_TIMEOUT = "ack_timeout"
    LEASE_EXPIRY = "lease_expiry"
    RECONCILE_CONFIRM = "reconcile_confirm"
    RECONCILE_LOST = "reconcile_lost"
    USER_CANCEL = "user_cancel"
    DEPENDENCY_FAILED = "dependency_failed"


Q, A, R, W = JobState.QUEUED, JobState.ACCEPTED, JobState.RUNNING, JobState.RETRYING
S, F, C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
_ENDINGS: Final = frozenset({W, F, C})

TRANSITIONS: Final[Mapping[Event, Mapping[JobState, frozenset[JobState]]]] = {
    Event.CLAIM: {Q: frozenset({A}), W: frozenset({A})},
    Event.ACK: {A: frozenset({R})},
    Event.PROGRESS: {R: frozenset({R})},
    Event.CANCEL_POLL: {A: frozenset({A}), R: frozenset({R})},
    Event.RESULT: {R: frozenset({S, W, F, C})},
    Event.ACK_TIMEOUT: {A: _ENDINGS},
    Event.LEASE_EXPIRY: {R: _ENDINGS},
    Event.RECONCILE_CONFIRM: {A: frozenset({A}), R: frozenset({R})},
    Event.RECONCILE_LOST: {A: _ENDINGS, R: _ENDINGS},
    Event.USER_CANCEL: {Q: frozenset({C}), W: frozenset({C}), A: frozenset({A}), R: frozenset({R})},
    Event.DEPENDENCY_FAILED: {Q: frozenset({C})},
}
"""The job state machine: event -> from-state -> the states it may lead to."""


def accepts(event: Event, state: JobState) -> bool:
    """True when a job in `state` accepts `event` at all."""
    return state in TRANSITIONS[event]


class Outcome(StrEnum):
    """What Run reports an attempt ended as, and how a job ends."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FailureReason(StrEnum):
    """Why an attempt ended without success."""

    ACK_TIMEOUT = "ack_timeout"
    LEASE_EXPIRED = "lease_expired"
    FAILED = "failed"
    RECONCILE_LOST = "reconcile_lost"


class CancelResult(StrEnum):
    """How a cancel intent resolved."""

    CANCELLED = "cancelled"
    COMPLETED_FIRST = "completed_first"


class ReconcileOutcome(StrEnum):
    """What the last reconciliation decided about the current attempt."""

    CONFIRMED = "confirmed"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error as Run reports it: a stable code and a human message."""

    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class RunResult:
    """A result Run reported for an attempt, with its terminal fingerprint."""

    outcome: Outcome
    retryable: bool
    error: ErrorInfo | None
    output_json: str | None
    fingerprint: str

    @classmethod
    def of(
        cls,
        outcome: str,
        retryable: bool,
        error: Mapping[str, Any] | None = None,
        output: JsonValue | None = None,
    ) -> RunResult:
        """Validate a reported result and compute its fingerprint."""
        if outcome not in Outcome.__members__.values():
            raise InvalidRequest("outcome must be one of succeeded, failed, cancelled")
        if not isinstance(retryable, bool):
            raise InvalidRequest("retryable must be a boolean")
        info = _error_info(error)
        output_json = None
        if output is not None:
            output_json = compact_json(output, field="output", limit=OUTPUT_LIMIT)
        fingerprint = result_fingerprint(
            outcome, retryable, info.as_dict() if info else None, output
        )
        return cls(Outcome(outcome), retryable, info, output_json, fingerprint)


def _error_info(error: Mapping[str, Any] | None) -> ErrorInfo | None:
    if error is None:
        return None
    if not isinstance(error, Mapping):
        raise InvalidRequest("error must be an object with code and message")
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not CODE_PATTERN.match(code):
        raise InvalidRequest("error.code must match ^[a-z][a-z0-9_.-]{0,63}$")
    if not isinstance(message, str) or len(message) > TEXT_LIMIT:
        raise InvalidRequest(f"error.message must be a string of at most {TEXT_LIMIT} characters")
    return ErrorInfo(code, message)


@dataclass(frozen=True, slots=True)
class RecordedResult:
    """The result accepted for an attempt, kept so that replays get the same answer."""

    attempt: int
    result: RunResult
    at: Instant


@dataclass(frozen=True, slots=True)
class Progress:
    """The last accepted progress report of the current attempt."""

    seq: int
    percent: float | None
    message: str | None
    at: Instant


@dataclass(frozen=True, slots=True)
class CancelState:
    """A durable cancel intent and, once resolved, its result."""

    requested_at: Instant
    requested_by: str
    result: CancelResult | None = None
    resolved_at: Instant | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the latest unsuccessful attempt ended."""

    reason: FailureReason
    attempt: int
    at: Instant
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Terminal:
    """How the job ended; never changes once set."""

    outcome: Outcome
    attempt: int
    at: Instant
    error: ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class ReconcileMark:
    """The latest reconciliation decision about the current attempt."""

    outcome: ReconcileOutcome
    at: Instant
    generation: int


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    """One finished attempt, for the job's history."""

    attempt: int
    claimed_at: Instant | None
    ended_at: Instant
    outcome: str
    """`succeeded`, `failed`, `cancelled`, or a failure reason such as `lease_expired`."""
    code: str | None = None
    silent: bool = False
    """Its Run said with its result that it printed no log line: its logs are complete
    (docs/protocol.md, "Silent attempts")."""


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A job's concurrency key: at most `limit` jobs of its owner with this key claimed or
    running at once (`scheduling/concurrency.py`)."""

    key: str
    limit: int = 1


@dataclass(frozen=True, slots=True)
class Job:
    """A job's whole scheduling record, exactly what the store persists."""

    id: str
    server_id: str
    endpoint_id: str
    owner_id: str
    """The user who owned the job's server when the job was made (servers never change
    owner); empty for jobs stored before jobs knew their owner whose server was removed."""
    kind: str
    payload_json: str
    """The payload as compact JSON (keys sorted). Users see it only through
    `views.job_view(..., payload=True)`, redacted (`scheduling/redaction.py`)."""
    policy: RetryPolicy
    state: JobState
    attempt: int
    """Number of claims so far; the current attempt when active."""
    eligible_at: Instant
    created_at: Instant
    updated_at: Instant
    version: int = 1
    lease_hash: str | None = None
    session_generation: int | None = None
    claimed_at: Instant | None = None
    ack_deadline: Instant | None = None
    lease_expires_at: Instant | None = None
    progress: Progress | None = None
    cancel: CancelState | None = None
    last_failure: Failure | None = None
    result: RecordedResult | None = None
    terminal: Terminal | None = None
    reconcile: ReconcileMark | None = None
    history: tuple[AttemptSummary, ...] = ()
    group_id: str | None = None
    """The fan-out group the job belongs to, if one made it (`scheduling/groups.py`)."""
    held: bool = False
    """Queued but not claimable until its group releases it (the group's `max_parallel`)."""
    concurrency: Concurrency | None = None
    """Its concurrency key and limit, if it carries one."""
    key_held: bool = False
    """Queued but not claimable until its key releases it (a job with a key is made so, and
    its key releases it while fewer than the key's limit are under way)."""
    schedule_id: str | None = None
    """The schedule whose firing made the job, if one did."""
    scheduled_for: Instant | None = None
    """The calendar time (or trigger time) of that firing."""
    after: tuple[str, ...] = ()
    """The jobs it waits on: held until each has succeeded (`scheduling/dependencies.py`)."""
    after_group: str | None = None
    """The group it waits on: held until every job of it has succeeded."""
    priority: int = DEFAULT_PRIORITY
    """0 to 9: among its endpoint's claimable jobs, a higher priority is granted first."""

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    @property
    def deadline_at(self) -> Instant | None:
        """The live deadline (ack deadline or execution lease expiry), indexed for the sweeper."""
        if self.state is JobState.ACCEPTED:
            return self.ack_deadline
        if self.state is JobState.RUNNING:
            return self.lease_expires_at
        return None

    @property
    def claimable_at(self) -> Instant | None:
        """When a claim may take the job: `eligible_at` while it waits without a cancel intent,
        else None. Stores index it for claims."""
        if self.state.is_waiting and self.cancel is None and not self.held and not self.key_held:
            return self.eligible_at
        return None

    @property
    def claim_rank(self) -> int | None:
        """`MAX_PRIORITY - priority` while the job is claimable (`claimable_at` set), else
        None: claims walk the ranks upwards, the most urgent first. Stores index it."""
        if self.claimable_at is None:
            return None
        return MAX_PRIORITY - self.priority

    @property
    def held_group_id(self) -> str | None:
        """The job's group while the job is held and still queued, else None. Stores index it
        to find what a group may release."""
        if self.held and self.state is JobState.QUEUED:
            return self.group_id
        return None

    @property
    def held_key(self) -> str | None:
        """The job's concurrency key while its key holds it (queued, and no longer held by its
        group), else None. Stores index it, with the owner, to find what a key may release."""
        if self.key_held and not self.held and self.state is JobState.QUEUED:
            return self.concurrency.key if self.concurrency is not None else None
        return None

    @property
    def live_key(self) -> str | None:
        """The job's concurrency key while the job takes one of the key's places (released
        by its key and not ended), else None. Stores index it, with the owner, to count them."""
        if self.concurrency is not None and not self.key_held and not self.state.is_terminal:
            return self.concurrency.key
        return None

    def unheld_by_key(self, now: Instant) -> Job:
        """The key-held job made claimable from `now` on (or from its `not_before`)."""
        return _evolve(
            self,
            key_held=False,
            eligible_at=max(self.eligible_at, now),
            version=self.version + 1,
            updated_at=now,
        )

    @property
    def waits_on(self) -> tuple[str, ...]:
        """The ids it names as dependencies (jobs, then its group), whether or not it still
        waits. Stores index them to find a job's waiters."""
        return self.after if self.after_group is None else (*self.after, self.after_group)

    @property
    def dependency_held(self) -> bool:
        """Held on its dependencies: still queued, held, and naming some. Stores index it for
        the sweeper's repair."""
        return self.held and self.state is JobState.QUEUED and bool(self.after or self.after_group)

    def unheld(self, now: Instant) -> Job:
        """The held job made claimable from `now` on (or from its `not_before`)."""
        return _evolve(
            self,
            held=False,
            eligible_at=max(self.eligible_at, now),
            version=self.version + 1,
            updated_at=now,
        )

    @property
    def terminal_fingerprint(self) -> str | None:
        """The fingerprint of the result that ended the job, if Run's result ended it."""
        if self.terminal is None or self.result is None:
            return None
        return (
            self.result.result.fingerprint if self.result.attempt == self.terminal.attempt else None
        )

    def payload(self) -> JsonValue:
        return json.loads(self.payload_json)


def transition(job: Job, event: Event, to: JobState, now: Instant, **changes: Any) -> Job:
    """The one guard: apply a transition the table allows, or raise `IllegalTransition`."""
    allowed = TRANSITIONS[event].get(job.state)
    if allowed is None or to not in allowed:
        raise IllegalTransition(f"{event} does not lead from {job.state} to {to} (job {job.id})")
    return _evolve(job, state=to, version=job.version + 1, updated_at=now, **changes)


_JOB_FIELDS: Final = tuple(f.name for f in fields(Job))
_set = object.__setattr__


def _evolve(job: Job, **changes: Any) -> Job:
    """`dataclasses.replace` without re-running `__init__`: the hot path of every transition.

    Unknown names fail (the class has slots), so a typo cannot add a field.
    """
    evolved = object.__new__(Job)
    for name in _JOB_FIELDS:
        _set(evolved, name, changes.pop(name) if name in changes else getattr(job, name))
    if changes:
        raise TypeError(f"Job has no fields {sorted(changes)}")
    return evolved


# -- creation and claims ---------------------------------------------------------------------


def create_job(
    *,
    job_id: str,
    server_id: str,
    endpoint_id: str,
    owner_id: str,
    kind: str,
    payload: JsonValue | None,
    policy: RetryPolicy,
    now: Instant,
    not_before: Instant | None = None,
    group_id: str | None = None,
    held: bool = False,
    schedule_id: str | None = None,
    scheduled_for: Instant | None = None,
    concurrency: Concurrency | None = None,
    after: tuple[str, ...] = (),
    after_group: str | None = None,
    priority: int | None = None,
) -> Job:
    """A new queued job, eligible at `not_before` (or now); `held` until its group releases
    it, and held as well while it names dependencies (`after`, `after_group`); of `priority`
    (or the default, 5)."""
    if not isinstance(kind, str) or not KIND_PATTERN.match(kind):
        raise InvalidRequest("kind must match ^[a-z][a-z0-9_.-]{0,63}$")
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise InvalidRequest("payload must be a JSON object")
    payload_json = compact_json(payload, field="payload", limit=PAYLOAD_LIMIT, shape=PAYLOAD_SHAPE)
    if not_before is not None and not 0 <= not_before <= now + NOT_BEFORE_HORIZON_MS:
        raise InvalidRequest("not_before must be from 1970 to one year from now")
    eligible_at = now if not_before is None else max(now, not_before)
    if priority is None:
        priority = DEFAULT_PRIORITY
    elif type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        problem = f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
        raise InvalidRequest(f"priority {problem}", fields=(("priority", problem),))
    return Job(
        id=job_id,
        server_id=server_id,
        endpoint_id=endpoint_id,
        owner_id=owner_id,
        kind=kind,
        payload_json=payload_json,
        policy=policy,
        state=JobState.QUEUED,
        attempt=0,
        eligible_at=eligible_at,
        created_at=now,
        updated_at=now,
        group_id=group_id,
        held=held or bool(after) or after_group is not None,
        concurrency=concurrency,
        key_held=concurrency is not None,
        schedule_id=schedule_id,
        scheduled_for=scheduled_for,
        after=after,
        after_group=after_group,
        priority=priority,
    )


def is_claimable(job: Job, now: Instant) -> bool:
    """Waiting, eligible by `now`, and not asked to cancel."""
    claimable_at = job.claimable_at
    return claimable_at is not None and claimable_at <= now


def claim(job: Job, *, now: Instant, lease_hash: str, generation: int, ack_timeout_ms: int) -> Job:
    """Start the next attempt under a new lease, bound to the claiming session's generation."""
    if not is_claimable(job, now):
        raise IllegalTransition(f"job {job.id} is not claimable")
    return transition(
        job,
        Event.CLAIM,
        JobState.ACCEPTED,
        now,
        attempt=job.attempt + 1,
        lease_hash=lease_hash,
        session_generation=generation,
        claimed_at=now,
        ack_deadline=now + ack_timeout_ms,
        lease_expires_at=None,
        progress=None,
        result=None,
        reconcile=None,
    )


# -- the end of an attempt ---------------------------------------------------------------------


_CANCEL_RESOLUTION: Final = {
    Outcome.CANCELLED: CancelResult.CANCELLED,
    Outcome.SUCCEEDED: CancelResult.COMPLETED_FIRST,
}


def finish(
    job: Job,
    event: Event,
    outcome: Outcome,
    now: Instant,
    error: ErrorInfo | None = None,
    **changes: Any,
) -> Job:
    """Move to a terminal state, resolving any open cancel intent."""
    cancel = job.cancel
    resolution = _CANCEL_RESOLUTION.get(outcome)
    if cancel is not None and cancel.result is None and resolution is not None:
        cancel = replace(cancel, result=resolution, resolved_at=now)
    terminal = Terminal(outcome=outcome, attempt=job.attempt, at=now, error=error)
    return transition(
        job, event, JobState(outcome.value), now, cancel=cancel, terminal=terminal, **changes
    )


def end_attempt(
    job: Job,
    event: Event,
    failure: Failure,
    *,
    now: Instant,
    draw: float,
    retryable: bool = True,
    result: RecordedResult | None = None,
    silent: bool = False,
) -> Job:
    """End the current attempt unsuccessfully: cancel intent wins, then retry, then failed.
    `silent`: its Run said the attempt printed no log line."""
    summary = AttemptSummary(
        attempt=job.attempt,
        claimed_at=job.claimed_at,
        ended_at=now,
        outcome=failure.reason.value,
        code=failure.code,
        silent=silent,
    )
    common: dict[str, Any] = {
        "last_failure": failure,
        "history": (*job.history, summary),
        "ack_deadline": None,
        "lease_expires_at": None,
    }
    if result is not None:
        common["result"] = result
    if job.cancel is not None:
        return finish(job, event, Outcome.CANCELLED, now, **common)
    if retryable and job.policy.allows_another_attempt(job.attempt):
        eligible_at = now + job.policy.backoff_ms(job.attempt, draw)
        return transition(job, event, JobState.RETRYING, now, eligible_at=eligible_at, **common)
    error = ErrorInfo(failure.code or failure.reason.value, failure.message or "")
    return finish(job, event, Outcome.FAILED, now, error=error, **common)


_DEADLINE_MESSAGES: Final = {
    FailureReason.ACK_TIMEOUT: "Run did not ack the attempt before its ack deadline",
    FailureReason.LEASE_EXPIRED: "the execution lease expired without an accepted renewal",
    FailureReason.RECONCILE_LOST: "Run's reconciliation did not confirm the attempt",
}


def platform_failure(reason: FailureReason, attempt: int, now: Instant) -> Failure:
    """A failure the platform decided (deadline passed, attempt lost)."""
    return Failure(reason, attempt, now, reason.value, _DEADLINE_MESSAGES[reason])


def apply_due_deadline(job: Job, *, now: Instant, draw: float) -> Job:
    """End the attempt if its ack deadline or execution lease has passed by `now`."""
    deadline = job.deadline_at
    if deadline is None or now < deadline:
        return job
    if job.state is JobState.ACCEPTED:
        event, reason = Event.ACK_TIMEOUT, FailureReason.ACK_TIMEOUT
    else:
        event, reason = Event.LEASE_EXPIRY, FailureReason.LEASE_EXPIRED
    return end_attempt(job, event, platform_failure(reason, job.attempt, now), now=now, draw=draw)


# -- user cancellation -------------------------------------------------------------------------


def request_cancel(job: Job, *, user_id: str, now: Instant) -> Job:
    """Persist a cancel intent: waiting jobs end at once, active ones wait for Run."""
    if job.state.is_terminal or job.cancel is not None:
        return job
    intent = CancelState(requested_at=now, requested_by=user_id)
    if job.state.is_active:
        return transition(job, Event.USER_CANCEL, job.state, now, cancel=intent)
    return finish(replace(job, cancel=intent), Event.USER_CANCEL, Outcome.CANCELLED, now)


def cancel_waits_on_run(job: Job) -> bool:
    """True while a cancel intent exists that only Run can resolve."""
    return job.cancel is not None and job.cancel.result is None and job.state.is_active
