"""Builders for the pure scheduling domain: jobs in each state, callers, evidence and results.

No store and no service: every record is built with the domain's own functions (`create_job`,
`claim`, `messages.ack`, ...), so a job in a given state got there the way the platform gets it
there. The lease of attempt `n` is always `lease_of(n)`.
"""

from __future__ import annotations

from typing import Any

from moonrun.scheduling import messages
from moonrun.scheduling.fingerprint import JsonValue, token_hash
from moonrun.scheduling.jobs import Job, JobState, RunResult, claim, create_job
from moonrun.scheduling.messages import Caller, Decision, Evidence
from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.time import Instant

T0: Instant = 1_780_000_000_000
"""A fixed `now` (2026-05-28T20:26:40.000Z) that every scenario starts from."""
ENDPOINT = "ep-1"
OTHER_ENDPOINT = "ep-2"
GENERATION = 1
OTHER_GENERATION = 2
ACK_TIMEOUT_MS = 30_000
LEASE_TTL_MS = 40_000
POLICY = RetryPolicy(max_attempts=3, initial_s=1.0, multiplier=2.0, max_s=60.0)
"""Three attempts, waiting 1 s then 2 s between them."""
SINGLE_ATTEMPT = RetryPolicy(max_attempts=1, initial_s=1.0, multiplier=2.0, max_s=60.0)


def lease_of(attempt: int) -> str:
    """The lease token the platform granted for `attempt` in these tests."""
    return f"mrl_lease-for-attempt-{attempt}"


def caller(endpoint_id: str = ENDPOINT, generation: int = GENERATION) -> Caller:
    return Caller(endpoint_id, generation)


def evidence(job: Job, *, attempt: int | None = None, lease: str | None = None) -> Evidence:
    """The evidence Run holds for `job`'s current attempt, or the given attempt/lease."""
    number = job.attempt if attempt is None else attempt
    return Evidence(number, lease_of(number) if lease is None else lease)


def queued_job(
    *,
    policy: RetryPolicy = POLICY,
    payload: JsonValue | None = None,
    job_id: str = "job-1",
    endpoint_id: str = ENDPOINT,
    now: Instant = T0,
) -> Job:
    return create_job(
        job_id=job_id,
        server_id="srv-1",
        endpoint_id=endpoint_id,
        owner_id="usr-1",
        kind="deploy.web",
        payload=payload,
        policy=policy,
        now=now,
    )


def claimed(job: Job, *, now: Instant = T0, generation: int = GENERATION) -> Job:
    """Claim the next attempt of a waiting job under `lease_of(attempt)`."""
    return claim(
        job,
        now=now,
        lease_hash=token_hash(lease_of(job.attempt + 1)),
        generation=generation,
        ack_timeout_ms=ACK_TIMEOUT_MS,
    )


def accepted_job(*, policy: RetryPolicy = POLICY, now: Instant = T0, **fields: Any) -> Job:
    """A job whose first attempt was claimed at `now` and is waiting for its ack."""
    return claimed(queued_job(policy=policy, now=now, **fields), now=now)


def acked(job: Job, *, now: Instant) -> Job:
    """Ack the current attempt of an accepted job as its own Run session would."""
    decision = messages.ack(
        job,
        caller(job.endpoint_id, job.session_generation or GENERATION),
        evidence(job),
        now=now,
        lease_ttl_ms=LEASE_TTL_MS,
        draw=0.0,
    )
    return accepted(decision, JobState.RUNNING)


def running_job(*, policy: RetryPolicy = POLICY, now: Instant = T0, **fields: Any) -> Job:
    """A job whose first attempt was claimed at `now` and acked one second later."""
    return acked(accepted_job(policy=policy, now=now, **fields), now=now + 1_000)


def reported(
    outcome: str = "succeeded",
    *,
    retryable: bool = False,
    error: dict[str, Any] | None = None,
    output: JsonValue | None = None,
) -> RunResult:
    return RunResult.of(outcome, retryable, error, output)


def send_result(job: Job, result: RunResult, *, now: Instant) -> Decision[messages.ResultAnswer]:
    """Report `result` for the current attempt from the job's own session."""
    return messages.result(
        job,
        caller(job.endpoint_id, job.session_generation or GENERATION),
        evidence(job),
        result,
        now=now,
        draw=0.0,
    )


def accepted(decision: Decision[Any], state: JobState) -> Job:
    """The record of a decision that must have been accepted and left the job in `state`."""
    assert decision.error is None, decision.error
    assert state == decision.job.state
    return decision.job
