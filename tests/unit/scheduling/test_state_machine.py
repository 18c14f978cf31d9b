"""The job state machine and Run's job messages: the table, fencing order and message effects."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from moonrun.errors import (
    AckDeadlineExpired,
    IllegalTransition,
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
from moonrun.scheduling import messages
from moonrun.scheduling.jobs import (
    TRANSITIONS,
    CancelResult,
    ErrorInfo,
    Event,
    FailureReason,
    Job,
    JobState,
    Outcome,
    apply_due_deadline,
    is_claimable,
    request_cancel,
    transition,
)
from moonrun.scheduling.messages import Caller, Decision, Evidence
from moonrun.scheduling.reconcile import lose
from tests.support.jobkit import (
    ACK_TIMEOUT_MS,
    ENDPOINT,
    GENERATION,
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
    evidence,
    lease_of,
    queued_job,
    reported,
    running_job,
    send_result,
)

ALL_TRIPLES = [(event, old, new) for event in Event for old in JobState for new in JobState]
ALLOWED = [(e, o, n) for e, o, n in ALL_TRIPLES if n in TRANSITIONS[e].get(o, frozenset())]
FORBIDDEN = [triple for triple in ALL_TRIPLES if triple not in ALLOWED]
TERMINAL = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
KINDS = ["ack", "progress", "cancel_poll", "result"]
ACK_DEADLINE = T0 + ACK_TIMEOUT_MS
"""The ack deadline of `accepted_job()`."""
LEASE_EXPIRY = T0 + 1_000 + LEASE_TTL_MS
"""The lease expiry of `running_job()` (acked one second after its claim)."""


def triple_id(triple: tuple[Event, JobState, JobState]) -> str:
    event, old, new = triple
    return f"{event}:{old}->{new}"


def send(
    kind: str, job: Job, who: Caller, proof: Evidence, *, now: int, seq: int = 1
) -> Decision[Any]:
    """Send one Run message of `kind` with neutral arguments."""
    if kind == "ack":
        return messages.ack(job, who, proof, now=now, lease_ttl_ms=LEASE_TTL_MS, draw=0.0)
    if kind == "progress":
        return messages.progress(
            job,
            who,
            proof,
            seq=seq,
            percent=None,
            message=None,
            now=now,
            lease_ttl_ms=LEASE_TTL_MS,
            draw=0.0,
        )
    if kind == "cancel_poll":
        return messages.cancel_poll(job, who, proof, now=now, draw=0.0)
    assert kind == "result"
    return messages.result(job, who, proof, reported(), now=now, draw=0.0)


def progress(job: Job, seq: int, *, now: int, who: Caller | None = None) -> Decision[Any]:
    return send("progress", job, who or caller(), evidence(job), now=now, seq=seq)


# -- the transition table --------------------------------------------------------------------


@pytest.mark.parametrize("triple", FORBIDDEN, ids=triple_id)
def test_transition_outside_the_table_is_illegal(
    triple: tuple[Event, JobState, JobState],
) -> None:
    """Every (event, from, to) the table does not list raises IllegalTransition."""
    event, old, new = triple
    job = replace(queued_job(), state=old)
    with pytest.raises(IllegalTransition):
        transition(job, event, new, T0 + 5)


@pytest.mark.parametrize("triple", ALLOWED, ids=triple_id)
def test_transition_in_the_table_bumps_version_and_updated_at(
    triple: tuple[Event, JobState, JobState],
) -> None:
    """Every listed transition succeeds, bumps version by one and stamps updated_at."""
    event, old, new = triple
    job = replace(queued_job(), state=old, version=7)
    moved = transition(job, event, new, T0 + 5, attempt=4)
    assert (new, 8, T0 + 5, 4) == (moved.state, moved.version, moved.updated_at, moved.attempt)
    assert replace(moved, state=old, version=7, updated_at=T0, attempt=0) == job


@pytest.mark.parametrize("state", TERMINAL)
def test_terminal_states_have_no_outgoing_transitions(state: JobState) -> None:
    """No event lists a terminal state as a from-state."""
    expected = []
    assert expected == [event for event in Event if state in TRANSITIONS[event]]
    assert state.is_terminal


def test_every_event_has_an_entry_in_the_table() -> None:
    """The table covers every event and only names job states."""
    assert set(Event) == set(TRANSITIONS)
    for targets in TRANSITIONS.values():
        for old, news in targets.items():
            assert isinstance(old, JobState)
            assert news <= set(JobState)


def test_claimable_once_eligible_at_is_reached() -> None:
    """A waiting job is claimable at eligible_at, not a millisecond before."""
    job = replace(queued_job(), eligible_at=T0 + 100)
    expected = (False, True)
    assert expected == (is_claimable(job, T0 + 99), is_claimable(job, T0 + 100))
    with pytest.raises(IllegalTransition):
        claimed(job, now=T0 + 99)


def test_claim_starts_the_next_attempt_under_a_fresh_ack_deadline() -> None:
    """A claim moves queued -> accepted with attempt+1, the session binding and ack deadline."""
    job = claimed(queued_job(), now=T0, generation=5)
    expected = (JobState.ACCEPTED, 1, 5, T0 + ACK_TIMEOUT_MS, 2)
    assert expected == (
        job.state,
        job.attempt,
        job.session_generation,
        job.ack_deadline,
        job.version,
    )


@pytest.mark.parametrize("make", [accepted_job, running_job], ids=["accepted", "running"])
def test_active_jobs_are_not_claimable(make: Any) -> None:
    """Claiming an active job raises IllegalTransition."""
    with pytest.raises(IllegalTransition):
        claimed(make(), now=T0 + 2_000)


# -- fencing order ---------------------------------------------------------------------------

FAULT_ORDER = ["endpoint", "attempt", "lease", "generation", "deadline"]
PAIRS = [(a, b) for i, a in enumerate(FAULT_ORDER) for b in FAULT_ORDER[i + 1 :]]
FIRST_FAULT_CODE = {
    "endpoint": "wrong_endpoint",
    "attempt": "stale_attempt",
    "lease": "lease_mismatch",
    "generation": "reconcile_required",
}
DEADLINE_CODE = {JobState.ACCEPTED: "ack_deadline_expired", JobState.RUNNING: "lease_expired"}


def active_job(state: JobState) -> Job:
    return accepted_job() if state is JobState.ACCEPTED else running_job()


def faulty_message(job: Job, faults: set[str]) -> tuple[Caller, Evidence, int]:
    """A caller, evidence and `now` for `job` with exactly the given faults."""
    who = caller(
        OTHER_ENDPOINT if "endpoint" in faults else ENDPOINT,
        OTHER_GENERATION if "generation" in faults else GENERATION,
    )
    attempt = job.attempt + 1 if "attempt" in faults else job.attempt
    lease = "mrl_someone-elses-lease" if "lease" in faults else lease_of(attempt)
    assert job.deadline_at is not None
    now = job.deadline_at if "deadline" in faults else job.deadline_at - 1
    return who, Evidence(attempt, lease), now


def expected_code(faults: set[str], state: JobState) -> str:
    """The first fault in contract order, where a passed deadline ends the active binding."""
    for fault in FAULT_ORDER:
        if fault == "generation" and "deadline" in faults:
            continue  # the deadline is applied first: the job is no longer active
        if fault in faults:
            return DEADLINE_CODE[state] if fault == "deadline" else FIRST_FAULT_CODE[fault]
    raise AssertionError("no fault")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("state", [JobState.ACCEPTED, JobState.RUNNING])
@pytest.mark.parametrize("faults", [(fault,) for fault in FAULT_ORDER] + PAIRS, ids="+".join)
def test_first_fault_in_contract_order_answers(
    faults: tuple[str, ...], state: JobState, kind: str
) -> None:
    """With one or two faults the earliest in the fencing order is the rejection."""
    job = active_job(state)
    who, proof, now = faulty_message(job, set(faults))
    decision = send(kind, job, who, proof, now=now)
    assert expected_code(set(faults), state) == (decision.error and decision.error.code)
    assert decision.answer is None
    if "deadline" in faults:
        assert decision.job.state is JobState.RETRYING
    else:
        assert decision.job is job


def test_pairwise_fault_codes_spelled_out() -> None:
    """The pairs named by the contract, spelled out for a running job's progress message."""
    job = running_job()
    cases = {
        ("endpoint", "attempt"): WrongEndpoint,
        ("attempt", "lease"): StaleAttempt,
        ("lease", "generation"): LeaseMismatch,
        ("generation", "deadline"): LeaseExpired,
    }
    actual = {}
    for faults in cases:
        who, proof, now = faulty_message(job, set(faults))
        actual[faults] = type(send("progress", job, who, proof, now=now).error)
    assert cases == actual


def test_other_generation_after_passed_ack_deadline_gets_ack_deadline_expired() -> None:
    """The deadline is applied before fencing, so the ended attempt is no longer bound."""
    job = accepted_job()
    decision = messages.ack(
        job,
        caller(generation=OTHER_GENERATION),
        evidence(job),
        now=ACK_DEADLINE,
        lease_ttl_ms=LEASE_TTL_MS,
        draw=0.0,
    )
    assert AckDeadlineExpired is type(decision.error)
    assert decision.job.state is JobState.RETRYING


@pytest.mark.parametrize(
    ("make", "kind", "seq"),
    [
        (accepted_job, "progress", 1),  # would be NotActive
        (accepted_job, "result", 1),  # would be NotActive
        (running_job, "progress", 0),  # would be SequenceRegression after seq 5
    ],
    ids=["progress-on-accepted", "result-on-accepted", "seq-regression"],
)
def test_reconcile_required_beats_state_checks(make: Any, kind: str, seq: int) -> None:
    """An active job bound to another generation answers reconcile_required first."""
    job = make()
    if job.state is JobState.RUNNING:
        job = accepted(progress(job, 5, now=T0 + 2_000), JobState.RUNNING)
    decision = send(
        kind, job, caller(generation=OTHER_GENERATION), evidence(job), now=T0 + 3_000, seq=seq
    )
    assert ReconcileRequired is type(decision.error)
    assert decision.job is job


def test_reconcile_required_beats_no_cancel_intent() -> None:
    """A cancelled result from another generation is reconcile_required, not no_cancel_intent."""
    job = running_job()
    decision = messages.result(
        job,
        caller(generation=OTHER_GENERATION),
        evidence(job),
        reported("cancelled"),
        now=T0 + 2_000,
        draw=0.0,
    )
    assert ReconcileRequired is type(decision.error)


@pytest.mark.parametrize("kind", ["progress", "result"])
def test_passed_ack_deadline_beats_not_active(kind: str) -> None:
    """Progress or a result on an un-acked attempt past its deadline: ack_deadline_expired."""
    job = accepted_job()
    decision = send(kind, job, caller(), evidence(job), now=ACK_DEADLINE)
    assert AckDeadlineExpired is type(decision.error)


def test_passed_lease_beats_sequence_regression() -> None:
    """A regressing seq after the lease passed gets lease_expired."""
    job = accepted(progress(running_job(), 5, now=T0 + 2_000), JobState.RUNNING)
    assert job.lease_expires_at is not None
    decision = progress(job, 1, now=job.lease_expires_at)
    assert LeaseExpired is type(decision.error)


# -- deadlines -------------------------------------------------------------------------------


def test_ack_just_before_the_deadline_is_accepted() -> None:
    """The ack deadline is live until now reaches it."""
    job = accepted_job()
    decision = send("ack", job, caller(), evidence(job), now=ACK_DEADLINE - 1)
    expected = messages.AckAnswer(JobState.RUNNING, ACK_DEADLINE - 1 + LEASE_TTL_MS)
    assert expected == decision.answer


def test_ack_at_the_deadline_is_expired_and_the_attempt_ends() -> None:
    """At now == ack deadline the ack is rejected and the job is retrying (ack_timeout)."""
    job = accepted_job()
    decision = send("ack", job, caller(), evidence(job), now=ACK_DEADLINE)
    failure = decision.job.last_failure
    assert AckDeadlineExpired is type(decision.error)
    assert decision.job.state is JobState.RETRYING
    assert failure is not None
    expected = (FailureReason.ACK_TIMEOUT, 1, ACK_DEADLINE, ACK_DEADLINE + 1_000)
    assert expected == (failure.reason, failure.attempt, failure.at, decision.job.eligible_at)


@pytest.mark.parametrize("kind", KINDS)
def test_later_messages_for_an_expired_attempt_keep_getting_ack_deadline_expired(
    kind: str,
) -> None:
    """Once the deadline ended the attempt, every message for it is ack_deadline_expired."""
    job = accepted_job()
    expired = send("ack", job, caller(), evidence(job), now=ACK_DEADLINE).job
    decision = send(kind, expired, caller(), evidence(expired), now=ACK_DEADLINE + 5_000)
    assert AckDeadlineExpired is type(decision.error)
    assert decision.job is expired


@pytest.mark.parametrize("kind", KINDS)
def test_deadline_applied_by_the_sweeper_is_reported_the_same(kind: str) -> None:
    """A deadline applied earlier (not by this message) still answers ack_deadline_expired."""
    swept = apply_due_deadline(accepted_job(), now=ACK_DEADLINE + 10, draw=0.0)
    decision = send(kind, swept, caller(), evidence(swept), now=ACK_DEADLINE + 20)
    assert AckDeadlineExpired is type(decision.error)
    assert decision.job is swept


def test_deadline_that_exhausts_the_budget_still_answers_ack_deadline_expired() -> None:
    """With one attempt the deadline fails the job, and the message still names the deadline."""
    job = accepted_job(policy=SINGLE_ATTEMPT)
    decision = send("ack", job, caller(), evidence(job), now=ACK_DEADLINE)
    assert AckDeadlineExpired is type(decision.error)
    assert decision.job.state is JobState.FAILED


@pytest.mark.parametrize("kind", ["progress", "cancel_poll", "result"])
def test_lease_expiry_answers_lease_expired(kind: str) -> None:
    """At now == lease expiry a running attempt ends with lease_expired."""
    job = running_job()
    decision = send(kind, job, caller(), evidence(job), now=LEASE_EXPIRY)
    failure = decision.job.last_failure
    assert LeaseExpired is type(decision.error)
    assert failure is not None
    expected = (JobState.RETRYING, FailureReason.LEASE_EXPIRED)
    assert expected == (decision.job.state, failure.reason)


def test_message_for_an_expired_attempt_after_a_new_claim_is_stale() -> None:
    """After the next claim, the old attempt's messages are stale_attempt."""
    expired = send("ack", accepted_job(), caller(), evidence(accepted_job()), now=ACK_DEADLINE).job
    again = claimed(expired, now=expired.eligible_at)
    decision = send("ack", again, caller(), evidence(again, attempt=1), now=expired.eligible_at)
    assert StaleAttempt is type(decision.error)


# -- ack, progress, cancel poll --------------------------------------------------------------


def test_ack_moves_accepted_to_running_with_a_lease() -> None:
    """An ack starts the execution lease and clears the ack deadline."""
    job = accepted_job()
    decision = send("ack", job, caller(), evidence(job), now=T0 + 500)
    assert messages.AckAnswer(JobState.RUNNING, T0 + 500 + LEASE_TTL_MS) == decision.answer
    assert (JobState.RUNNING, None, T0 + 500 + LEASE_TTL_MS, job.version + 1) == (
        decision.job.state,
        decision.job.ack_deadline,
        decision.job.lease_expires_at,
        decision.job.version,
    )


def test_repeated_ack_gets_the_same_answer_and_changes_nothing() -> None:
    """A second ack of the same attempt answers as the first and stores nothing new."""
    job = accepted_job()
    first = send("ack", job, caller(), evidence(job), now=T0 + 500)
    again = send("ack", first.job, caller(), evidence(job), now=T0 + 9_000)
    assert first.answer == again.answer
    assert again.job is first.job


def test_ack_after_the_job_ended_is_not_active() -> None:
    """An ack for a finished attempt is rejected as not_active."""
    done = accepted(send_result(running_job(), reported(), now=T0 + 2_000), JobState.SUCCEEDED)
    decision = send("ack", done, caller(), evidence(done), now=T0 + 3_000)
    assert NotActive is type(decision.error)
    assert decision.job is done


def test_progress_records_and_renews_the_lease() -> None:
    """Progress stores seq/percent/message and renews the lease from now."""
    job = running_job()
    decision = messages.progress(
        job,
        caller(),
        evidence(job),
        seq=3,
        percent=42.5,
        message="halfway",
        now=T0 + 7_000,
        lease_ttl_ms=LEASE_TTL_MS,
        draw=0.0,
    )
    assert messages.ProgressAnswer(T0 + 7_000 + LEASE_TTL_MS, False) == decision.answer
    assert decision.job.progress is not None
    expected = (3, 42.5, "halfway", T0 + 7_000)
    assert expected == (
        decision.job.progress.seq,
        decision.job.progress.percent,
        decision.job.progress.message,
        decision.job.progress.at,
    )


def test_repeated_progress_seq_gets_the_same_answer_without_change() -> None:
    """Repeating the last seq answers as before and neither records nor renews."""
    first = progress(running_job(), 3, now=T0 + 2_000)
    again = progress(first.job, 3, now=T0 + 9_000)
    assert first.answer == again.answer
    assert again.job is first.job


def test_lower_progress_seq_is_a_sequence_regression() -> None:
    """A seq below the last accepted one is rejected and changes nothing."""
    job = accepted(progress(running_job(), 3, now=T0 + 2_000), JobState.RUNNING)
    decision = progress(job, 2, now=T0 + 3_000)
    assert SequenceRegression is type(decision.error)
    assert decision.job is job


def test_progress_on_an_accepted_job_is_not_active() -> None:
    """Progress before the ack is not_active."""
    job = accepted_job()
    decision = progress(job, 1, now=T0 + 1_000)
    assert NotActive is type(decision.error)
    assert decision.job is job


@pytest.mark.parametrize(
    "fields",
    [
        {"seq": -1},
        {"seq": True},
        {"seq": 2**53},
        {"percent": 100.5},
        {"percent": -1},
        {"percent": True},
        {"message": "m" * 4097},
    ],
    ids=repr,
)
def test_malformed_progress_is_invalid(fields: dict[str, Any]) -> None:
    """Bad seq, percent or message raise InvalidRequest before any fencing."""
    job = running_job()
    arguments: dict[str, Any] = {"seq": 1, "percent": None, "message": None, **fields}
    with pytest.raises(InvalidRequest):
        messages.progress(
            job, caller(), evidence(job), now=T0, lease_ttl_ms=LEASE_TTL_MS, draw=0.0, **arguments
        )


def test_cancel_poll_reports_the_intent() -> None:
    """cancel_poll answers whether and when a cancel was requested, changing nothing."""
    job = running_job()
    before = send("cancel_poll", job, caller(), evidence(job), now=T0 + 2_000)
    wanted = request_cancel(job, user_id="u-1", now=T0 + 3_000)
    after = send("cancel_poll", wanted, caller(), evidence(job), now=T0 + 4_000)
    assert messages.CancelPollAnswer(False, None) == before.answer
    assert messages.CancelPollAnswer(True, T0 + 3_000) == after.answer
    assert (before.job, after.job) == (job, wanted)
    assert after.job is wanted


def test_progress_tells_run_about_a_cancel_intent() -> None:
    """After a cancel request, progress answers cancel_requested=True."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 1_500)
    decision = progress(wanted, 1, now=T0 + 2_000)
    assert messages.ProgressAnswer(T0 + 2_000 + LEASE_TTL_MS, True) == decision.answer


# -- results ---------------------------------------------------------------------------------


def test_success_ends_the_job() -> None:
    """A succeeded result makes the job succeeded with a terminal record and history."""
    job = running_job()
    result = reported(output={"ok": True})
    decision = send_result(job, result, now=T0 + 5_000)
    expected = messages.ResultAnswer(JobState.SUCCEEDED, 1, result.fingerprint, None, False)
    assert expected == decision.answer
    assert decision.job.terminal is not None
    expected = (Outcome.SUCCEEDED, 1, T0 + 5_000)
    assert expected == (
        decision.job.terminal.outcome,
        decision.job.terminal.attempt,
        decision.job.terminal.at,
    )
    assert result.fingerprint == decision.job.terminal_fingerprint
    expected = ["succeeded"]
    assert expected == [past.outcome for past in decision.job.history]


def test_result_replay_with_the_same_fingerprint_is_replayed() -> None:
    """The same result again gets the stored answer with replayed=True and no change."""
    first = send_result(running_job(), reported(output={"n": 1}), now=T0 + 5_000)
    again = send_result(first.job, reported(output={"n": 1.0}), now=T0 + 9_000)
    assert first.answer is not None
    assert replace(first.answer, replayed=True) == again.answer
    assert again.job is first.job


def test_result_with_a_different_fingerprint_is_a_terminal_conflict() -> None:
    """A different result for the recorded attempt is terminal_conflict."""
    first = send_result(running_job(), reported(output={"n": 1}), now=T0 + 5_000)
    again = send_result(first.job, reported(output={"n": 2}), now=T0 + 9_000)
    assert TerminalConflict is type(again.error)
    assert again.job is first.job


def test_retryable_failure_with_budget_left_retries_and_replays() -> None:
    """A retryable failure schedules the next attempt after backoff; its replay says so too."""
    failure = reported("failed", retryable=True, error={"code": "flaky", "message": "try again"})
    first = send_result(running_job(), failure, now=T0 + 5_000)
    again = send_result(first.job, failure, now=T0 + 5_500)
    expected = messages.ResultAnswer(JobState.RETRYING, 1, failure.fingerprint, T0 + 6_000, False)
    assert expected == first.answer
    assert replace(expected, replayed=True) == again.answer
    last = first.job.last_failure
    assert last is not None
    expected = (FailureReason.FAILED, "flaky", "try again")
    assert expected == (last.reason, last.code, last.message)


def test_replay_needs_no_generation_binding() -> None:
    """A recorded result is replayed to a newer session once the job is no longer active."""
    failure = reported("failed", retryable=True)
    first = send_result(running_job(), failure, now=T0 + 5_000)
    decision = messages.result(
        first.job,
        caller(generation=OTHER_GENERATION),
        evidence(first.job),
        failure,
        now=T0 + 6_000,
        draw=0.0,
    )
    assert decision.answer is not None
    assert decision.answer.replayed


def test_cancelled_result_without_intent_is_rejected() -> None:
    """Run may only report cancelled when a cancel was requested."""
    job = running_job()
    decision = send_result(job, reported("cancelled"), now=T0 + 5_000)
    assert NoCancelIntent is type(decision.error)
    assert decision.job is job


def test_cancelled_result_with_intent_cancels() -> None:
    """With an intent, a cancelled result ends the job cancelled and resolves the intent."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 2_000)
    ended = accepted(send_result(wanted, reported("cancelled"), now=T0 + 5_000), JobState.CANCELLED)
    assert ended.cancel is not None
    expected = (CancelResult.CANCELLED, T0 + 5_000)
    assert expected == (ended.cancel.result, ended.cancel.resolved_at)


def test_failure_with_a_cancel_intent_ends_cancelled() -> None:
    """Cancel intent wins over retry: a retryable failure ends the job cancelled."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 2_000)
    failure = reported("failed", retryable=True, error={"code": "boom", "message": "x"})
    ended = accepted(send_result(wanted, failure, now=T0 + 5_000), JobState.CANCELLED)
    assert ended.cancel is not None
    assert ended.terminal is not None
    expected = (CancelResult.CANCELLED, Outcome.CANCELLED)
    assert expected == (
        ended.cancel.result,
        ended.terminal.outcome,
    )


def test_success_with_a_cancel_intent_completes_first() -> None:
    """Success after a cancel request ends succeeded; the intent resolves completed_first."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 2_000)
    ended = accepted(send_result(wanted, reported(), now=T0 + 5_000), JobState.SUCCEEDED)
    assert ended.cancel is not None
    expected = CancelResult.COMPLETED_FIRST
    assert expected == ended.cancel.result


def test_retryable_failure_on_the_last_attempt_fails() -> None:
    """With the budget spent, a retryable failure ends the job failed with Run's error."""
    job = running_job(policy=SINGLE_ATTEMPT)
    failure = reported("failed", retryable=True, error={"code": "boom", "message": "it broke"})
    ended = accepted(send_result(job, failure, now=T0 + 5_000), JobState.FAILED)
    assert ended.terminal is not None
    assert ErrorInfo("boom", "it broke") == ended.terminal.error


def test_non_retryable_failure_fails_at_once() -> None:
    """A non-retryable failure ends the job failed even with budget left."""
    failure = reported("failed", retryable=False)
    ended = accepted(send_result(running_job(), failure, now=T0 + 5_000), JobState.FAILED)
    assert ended.terminal is not None
    assert ErrorInfo("failed", "") == ended.terminal.error


def test_result_before_ack_is_not_active() -> None:
    """Run must ack before it reports a result."""
    job = accepted_job()
    decision = send_result(job, reported(), now=T0 + 1_000)
    assert NotActive is type(decision.error)
    assert decision.job is job


def test_result_for_a_job_that_ended_without_one_is_a_terminal_conflict() -> None:
    """A job lost by reconcile and then cancelled has no result to replay."""
    lost = lose(running_job(), caller(generation=OTHER_GENERATION), now=T0 + 2_000, draw=0.0)
    ended = request_cancel(lost, user_id="u-1", now=T0 + 2_500)
    decision = send_result(ended, reported(), now=T0 + 3_000)
    assert ended.state is JobState.CANCELLED
    assert TerminalConflict is type(decision.error)


# -- user cancellation -----------------------------------------------------------------------


def retrying_job() -> Job:
    """A job whose first attempt failed retryably and now waits for attempt 2."""
    return accepted(
        send_result(running_job(), reported("failed", retryable=True), now=T0 + 2_000),
        JobState.RETRYING,
    )


@pytest.mark.parametrize("make", [queued_job, retrying_job], ids=["queued", "retrying"])
def test_cancel_of_a_waiting_job_ends_it_at_once(make: Any) -> None:
    """A waiting job is cancelled immediately, with the intent recorded and resolved."""
    job = make()
    ended = request_cancel(job, user_id="u-1", now=T0 + 3_000)
    assert ended.cancel is not None
    assert ended.terminal is not None
    expected = (JobState.CANCELLED, "u-1", T0 + 3_000, CancelResult.CANCELLED, T0 + 3_000)
    assert expected == (
        ended.state,
        ended.cancel.requested_by,
        ended.cancel.requested_at,
        ended.cancel.result,
        ended.cancel.resolved_at,
    )
    assert (Outcome.CANCELLED, job.version + 1) == (ended.terminal.outcome, ended.version)


@pytest.mark.parametrize("make", [accepted_job, running_job], ids=["accepted", "running"])
def test_cancel_of_an_active_job_only_records_the_intent(make: Any) -> None:
    """An active job keeps its state; only an open intent is recorded."""
    job = make()
    wanted = request_cancel(job, user_id="u-1", now=T0 + 3_000)
    assert wanted.cancel is not None
    assert (job.state, None, None, job.version + 1) == (
        wanted.state,
        wanted.cancel.result,
        wanted.terminal,
        wanted.version,
    )


def test_repeated_cancel_returns_the_same_record() -> None:
    """A second cancel request changes nothing and returns the very same object."""
    wanted = request_cancel(running_job(), user_id="u-1", now=T0 + 3_000)
    assert request_cancel(wanted, user_id="u-2", now=T0 + 4_000) is wanted
    ended = request_cancel(queued_job(), user_id="u-1", now=T0 + 3_000)
    assert request_cancel(ended, user_id="u-2", now=T0 + 4_000) is ended


def test_cancel_of_a_finished_job_changes_nothing() -> None:
    """A terminal job ignores cancel requests."""
    done = accepted(send_result(running_job(), reported(), now=T0 + 2_000), JobState.SUCCEEDED)
    assert request_cancel(done, user_id="u-1", now=T0 + 3_000) is done


def test_rejections_are_job_rejected_errors() -> None:
    """Every fencing rejection is a JobRejected with a wire code."""
    job = running_job()
    decision = send("ack", job, caller(endpoint_id=OTHER_ENDPOINT), evidence(job), now=T0)
    assert isinstance(decision.error, JobRejected)
    expected = (403, "wrong_endpoint")
    assert expected == (decision.error.status, decision.error.code)


def test_acked_helper_binds_the_session() -> None:
    """Sanity check of the builders: a running job is bound to GENERATION with lease 1."""
    job = acked(accepted_job(), now=T0 + 1_000)
    expected = (JobState.RUNNING, GENERATION, LEASE_EXPIRY)
    assert expected == (
        job.state,
        job.session_generation,
        job.lease_expires_at,
    )
