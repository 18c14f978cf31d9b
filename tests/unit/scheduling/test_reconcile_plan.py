"""Reconciliation: classifying Run's journal entries, planning, confirming and losing attempts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from moonrun.errors import IllegalTransition
from moonrun.scheduling.jobs import (
    CancelResult,
    ErrorInfo,
    FailureReason,
    Job,
    JobState,
    Outcome,
    ReconcileMark,
    ReconcileOutcome,
    apply_due_deadline,
    request_cancel,
)
from moonrun.scheduling.reconcile import (
    Discard,
    DiscardReason,
    ReconcileEntry,
    ReconcilePlan,
    classify,
    confirm,
    lose,
    plan,
)
from tests.support.jobkit import (
    ACK_TIMEOUT_MS,
    ENDPOINT,
    LEASE_TTL_MS,
    OTHER_ENDPOINT,
    OTHER_GENERATION,
    SINGLE_ATTEMPT,
    T0,
    accepted,
    accepted_job,
    acked,
    caller,
    claimed,
    lease_of,
    queued_job,
    reported,
    running_job,
    send_result,
)

NOW = T0 + 5_000
NEW_SESSION = caller(generation=OTHER_GENERATION)


def entry_for(job: Job, *, attempt: int | None = None, lease: str | None = None) -> ReconcileEntry:
    """Run's journal entry for `job`'s current attempt, or a wrong attempt/lease."""
    number = job.attempt if attempt is None else attempt
    return ReconcileEntry(job.id, number, lease_of(number) if lease is None else lease)


def succeeded_job(*, job_id: str = "job-1", endpoint_id: str = ENDPOINT) -> Job:
    """A job whose first attempt reported success."""
    job = running_job(job_id=job_id, endpoint_id=endpoint_id)
    return accepted(send_result(job, reported(), now=T0 + 2_000), JobState.SUCCEEDED)


def retrying_job() -> Job:
    """Attempt 1 passed its ack deadline; the job waits for attempt 2 with lease 1 on record."""
    job = apply_due_deadline(accepted_job(), now=T0 + ACK_TIMEOUT_MS, draw=0.0)
    assert job.state is JobState.RETRYING
    return job


# -- classify --------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [accepted_job, running_job], ids=["accepted", "running"])
def test_matching_entry_for_an_active_job_is_confirmed(make: Callable[[], Job]) -> None:
    """An entry naming the live attempt and lease of an active job classifies as None."""
    job = make()
    assert classify(entry_for(job), job, ENDPOINT) is None


def test_unknown_job_is_discarded_as_unknown() -> None:
    """No record for the entry's job: unknown."""
    expected = DiscardReason.UNKNOWN
    assert expected == classify(ReconcileEntry("nope", 1, lease_of(1)), None, ENDPOINT)


@pytest.mark.parametrize(
    ("job", "entry_fields", "expected"),
    [
        # each case has the named fault and every later one, so precedence is checked
        (running_job(endpoint_id=OTHER_ENDPOINT), {}, DiscardReason.WRONG_ENDPOINT),
        (succeeded_job(endpoint_id=OTHER_ENDPOINT), {"attempt": 7}, DiscardReason.WRONG_ENDPOINT),
        (succeeded_job(), {}, DiscardReason.TERMINAL),
        (succeeded_job(), {"attempt": 7, "lease": "mrl_x"}, DiscardReason.TERMINAL),
        (running_job(), {"attempt": 2}, DiscardReason.WRONG_ATTEMPT),
        (retrying_job(), {"attempt": 2, "lease": "mrl_x"}, DiscardReason.WRONG_ATTEMPT),
        (running_job(), {"lease": "mrl_x"}, DiscardReason.WRONG_LEASE),
        (retrying_job(), {"lease": "mrl_x"}, DiscardReason.WRONG_LEASE),
        (retrying_job(), {}, DiscardReason.NOT_ACTIVE),
    ],
    ids=[
        "wrong_endpoint",
        "wrong_endpoint-over-terminal-and-attempt",
        "terminal",
        "terminal-over-attempt-and-lease",
        "wrong_attempt",
        "wrong_attempt-over-lease-and-not_active",
        "wrong_lease",
        "wrong_lease-over-not_active",
        "not_active",
    ],
)
def test_discard_reasons_and_their_precedence(
    job: Job, entry_fields: dict[str, Any], expected: DiscardReason
) -> None:
    """The first applicable reason in the documented order is the one reported."""
    entry = entry_for(job, **entry_fields)
    assert expected == classify(entry, job, ENDPOINT)


def test_queued_job_entry_is_discarded_as_wrong_lease() -> None:
    """A never-claimed job has no lease on record, so attempt 0 fails the lease check first."""
    job = queued_job()
    expected = DiscardReason.WRONG_LEASE
    assert expected == classify(entry_for(job), job, ENDPOINT)


# -- plan ------------------------------------------------------------------------------------


def test_plan_confirms_discards_and_loses() -> None:
    """Matching entries confirm, bad ones discard, and active jobs left out are lost."""
    kept = running_job(job_id="kept")
    kept_accepted = accepted_job(job_id="kept-accepted")
    omitted = running_job(job_id="omitted")
    finished = succeeded_job(job_id="finished")
    foreign = running_job(job_id="foreign", endpoint_id=OTHER_ENDPOINT)
    jobs = {job.id: job for job in (kept, kept_accepted, omitted, finished, foreign)}
    entries = [
        entry_for(kept),
        ReconcileEntry("ghost", 1, lease_of(1)),
        entry_for(finished),
        entry_for(kept_accepted),
        entry_for(foreign),
    ]
    active = [kept, omitted, kept_accepted]
    expected = ReconcilePlan(
        confirm=("kept", "kept-accepted"),
        discard=(
            Discard("ghost", 1, DiscardReason.UNKNOWN),
            Discard("finished", 1, DiscardReason.TERMINAL),
            Discard("foreign", 1, DiscardReason.WRONG_ENDPOINT),
        ),
        lost=("omitted",),
    )
    assert expected == plan(entries, jobs, active, ENDPOINT, generation=OTHER_GENERATION)


def test_wrong_attempt_entry_for_an_active_job_is_discarded_and_lost() -> None:
    """An entry that does not match the live attempt neither confirms nor protects the job."""
    job = running_job()
    stale = entry_for(job, attempt=job.attempt + 1)
    expected = ReconcilePlan(
        confirm=(), discard=(Discard(job.id, 2, DiscardReason.WRONG_ATTEMPT),), lost=(job.id,)
    )
    assert expected == plan([stale], {job.id: job}, [job], ENDPOINT, generation=OTHER_GENERATION)


def test_empty_journal_loses_every_active_job() -> None:
    """With no entries, every active job of the endpoint is lost, in the given order."""
    jobs = [running_job(job_id="b"), accepted_job(job_id="a")]
    expected = ReconcilePlan(confirm=(), discard=(), lost=("b", "a"))
    assert expected == plan([], {}, jobs, ENDPOINT, generation=OTHER_GENERATION)


def test_an_active_job_of_the_reconciling_sessions_own_generation_is_never_lost() -> None:
    """A job the reconciling session itself claimed (bound to its generation) is not lost
    by a report that leaves it out: a retried or replayed copy of the session's own earlier
    reconciliation cannot speak for it. A job of an older generation still is."""
    mine = acked(claimed(queued_job(job_id="mine"), generation=OTHER_GENERATION), now=T0 + 1)
    older = running_job(job_id="older")
    expected = ReconcilePlan(confirm=(), discard=(), lost=("older",))
    assert expected == plan([], {}, [mine, older], ENDPOINT, generation=OTHER_GENERATION)


def test_empty_journal_and_no_active_jobs_is_an_empty_plan() -> None:
    """Nothing reported and nothing active: nothing to do."""
    assert ReconcilePlan((), (), ()) == plan([], {}, [], ENDPOINT, generation=OTHER_GENERATION)


# -- confirm ---------------------------------------------------------------------------------


def test_confirm_of_an_accepted_job_renews_the_ack_deadline() -> None:
    """An accepted attempt is rebound to the new generation with a fresh ack deadline."""
    job = accepted_job()
    confirmed = confirm(
        job, NEW_SESSION, now=NOW, ack_timeout_ms=ACK_TIMEOUT_MS, lease_ttl_ms=LEASE_TTL_MS
    )
    expected = replace(
        job,
        version=job.version + 1,
        updated_at=NOW,
        session_generation=OTHER_GENERATION,
        ack_deadline=NOW + ACK_TIMEOUT_MS,
        reconcile=ReconcileMark(ReconcileOutcome.CONFIRMED, NOW, OTHER_GENERATION),
    )
    assert expected == confirmed
    assert confirmed.lease_expires_at is None


def test_confirm_of_a_running_job_renews_the_execution_lease() -> None:
    """A running attempt is rebound with a fresh lease expiry and no ack deadline."""
    job = running_job()
    confirmed = confirm(
        job, NEW_SESSION, now=NOW, ack_timeout_ms=ACK_TIMEOUT_MS, lease_ttl_ms=LEASE_TTL_MS
    )
    expected = replace(
        job,
        version=job.version + 1,
        updated_at=NOW,
        session_generation=OTHER_GENERATION,
        lease_expires_at=NOW + LEASE_TTL_MS,
        reconcile=ReconcileMark(ReconcileOutcome.CONFIRMED, NOW, OTHER_GENERATION),
    )
    assert expected == confirmed
    assert confirmed.ack_deadline is None


def test_confirm_of_a_waiting_job_is_illegal() -> None:
    """Only active attempts can be confirmed."""
    with pytest.raises(IllegalTransition):
        confirm(
            retrying_job(),
            NEW_SESSION,
            now=NOW,
            ack_timeout_ms=ACK_TIMEOUT_MS,
            lease_ttl_ms=LEASE_TTL_MS,
        )


# -- lose ------------------------------------------------------------------------------------


def lost_mark() -> ReconcileMark:
    return ReconcileMark(ReconcileOutcome.LOST, NOW, OTHER_GENERATION)


@pytest.mark.parametrize("make", [accepted_job, running_job], ids=["accepted", "running"])
def test_lost_attempt_with_budget_left_retries(make: Callable[[], Job]) -> None:
    """A lost attempt with attempts left retries after its backoff, marked lost."""
    job = make()
    lost = lose(job, NEW_SESSION, now=NOW, draw=0.0)
    failure = lost.last_failure
    assert failure is not None
    expected = (
        JobState.RETRYING,
        NOW + 1_000,
        lost_mark(),
        (FailureReason.RECONCILE_LOST, 1),
        (None, None),
        ["reconcile_lost"],
        job.version + 1,
    )
    actual = (
        lost.state,
        lost.eligible_at,
        lost.reconcile,
        (failure.reason, failure.attempt),
        (lost.ack_deadline, lost.lease_expires_at),
        [past.outcome for past in lost.history],
        lost.version,
    )
    assert expected == actual


def test_lost_attempt_with_jitter_draw_waits_less() -> None:
    """The draw passed to lose feeds the backoff jitter."""
    policy = replace(SINGLE_ATTEMPT, max_attempts=3, jitter=0.5)
    lost = lose(running_job(policy=policy), NEW_SESSION, now=NOW, draw=0.5)
    expected = NOW + 750
    assert expected == lost.eligible_at


def test_lost_attempt_on_the_last_attempt_fails() -> None:
    """With the budget spent, a lost attempt fails the job with code reconcile_lost."""
    lost = lose(running_job(policy=SINGLE_ATTEMPT), NEW_SESSION, now=NOW, draw=0.0)
    assert lost.terminal is not None
    expected = (
        JobState.FAILED,
        Outcome.FAILED,
        ErrorInfo("reconcile_lost", "Run's reconciliation did not confirm the attempt"),
        lost_mark(),
    )
    assert expected == (lost.state, lost.terminal.outcome, lost.terminal.error, lost.reconcile)


def test_lost_attempt_with_a_cancel_intent_is_cancelled() -> None:
    """Cancel intent wins over retry: a lost attempt with an intent ends cancelled."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 2_000)
    lost = lose(wanted, NEW_SESSION, now=NOW, draw=0.0)
    assert lost.cancel is not None
    expected = (JobState.CANCELLED, CancelResult.CANCELLED, NOW, lost_mark())
    actual = (lost.state, lost.cancel.result, lost.cancel.resolved_at, lost.reconcile)
    assert expected == actual


def test_lose_of_a_waiting_job_is_illegal() -> None:
    """Only active attempts can be lost."""
    with pytest.raises(IllegalTransition):
        lose(retrying_job(), NEW_SESSION, now=NOW, draw=0.0)
