"""Every platform scenario of the durable-scheduling spec, at the service level, on every store.

Test names are the spec's scenario names; `docs/requirements.md` maps them back.
"""

from __future__ import annotations

import pytest

from moonrun.errors import (
    AckDeadlineExpired,
    Forbidden,
    LeaseExpired,
    LeaseMismatch,
    NoCancelIntent,
    NotFound,
    ReconcileRequired,
    SessionExpired,
    SessionRotated,
    SignatureInvalid,
    StaleAttempt,
    TerminalConflict,
    WrongEndpoint,
)
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import CancelResult, FailureReason, JobState, ReconcileOutcome
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import DiscardReason, ReconcileEntry
from moonrun.scheduling.views import job_view
from tests.support.harness import Run, World

SECOND = 1000


def fail_retryably(world: World, job_id: str, run: Run | None = None) -> int:
    """Run one attempt of `job_id` to a retryable failure; returns that attempt."""
    run = run or world.run().start()
    attempt = run.run_to_running(job_id)
    run.result(job_id, attempt, "failed", retryable=True, error={"code": "boom", "message": "x"})
    return attempt


# -- Requirement: Durable scheduling state ----------------------------------------------------


def test_platform_reload_preserves_active_attempt(world: World) -> None:
    """A new service over the same store keeps the attempt authoritative and accepts its lease."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    run.progress(job.id, attempt, 1, percent=10.0)
    world.service.cancel_job(world.owner, job.id)
    before = world.job(job.id)

    world.restart()

    after = world.job(job.id)
    assert before == after
    assert (world.endpoint.id, 1, JobState.RUNNING) == (
        after.endpoint_id,
        after.attempt,
        after.state,
    )
    assert token_hash(run.leases[(job.id, attempt)]) == after.lease_hash
    world.clock.advance(5 * SECOND)
    answer = run.progress(job.id, attempt, 2, percent=20.0)
    assert answer.cancel_requested is True
    assert world.clock.now() + world.settings.lease_ttl_ms == answer.lease_expires_at


def test_file_and_mysql_reload_preserve_queued_work(world: World) -> None:
    """After a reopen, retry-wait work is claimable exactly at its eligibility, attempt intact."""
    job = world.submit()
    queued = world.submit(not_before=world.clock.now() + 10 * SECOND)
    attempt = fail_retryably(world, job.id)
    eligible_at = world.job(job.id).eligible_at

    world.restart()

    assert (JobState.RETRYING, attempt) == (world.job(job.id).state, world.job(job.id).attempt)
    run = world.run().start()
    world.clock.advance(eligible_at - 1 - world.clock.now())
    assert run.claim(4) == []
    world.clock.advance(1)
    assert [(job.id, attempt + 1)] == [(c.job_id, c.attempt) for c in run.claim(4)]
    world.clock.advance(queued.eligible_at - 1 - world.clock.now())
    assert run.claim(4) == []
    world.clock.advance(1)
    assert [(queued.id, 1)] == [(c.job_id, c.attempt) for c in run.claim(4)]


# -- Requirement: Lease and attempt fencing ----------------------------------------------------


def test_ack_deadline_expires(world: World) -> None:
    """A late ack is rejected and the job waits for a later attempt."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)

    with pytest.raises(AckDeadlineExpired):
        run.ack(job.id, granted.attempt)

    stored = world.job(job.id)
    assert stored.state == JobState.RETRYING
    assert stored.last_failure is not None
    assert (
        stored.last_failure.reason,
        stored.last_failure.attempt,
    ) == (FailureReason.ACK_TIMEOUT, 1)
    assert world.clock.now() + 1 * SECOND == stored.eligible_at
    with pytest.raises(AckDeadlineExpired):
        run.ack(job.id, granted.attempt)


def test_ack_deadline_expires_on_the_last_attempt_fails_the_job(world: World) -> None:
    """With the retry budget spent, the sweeper records terminal failure instead."""
    job = world.submit(max_attempts=1)
    run = world.run().start()
    run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)

    assert world.service.sweep() == 1

    stored = world.job(job.id)
    assert stored.terminal is not None
    assert (
        stored.state,
        stored.terminal.error.code if stored.terminal.error else None,
    ) == (JobState.FAILED, "ack_timeout")
    world.clock.advance(3600 * SECOND)
    assert world.run().start().claim(4) == []


def test_execution_lease_expires(world: World) -> None:
    """Without accepted renewals the lease is cleared and retry policy applies durably."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    world.clock.advance(world.settings.lease_ttl_ms - 1)
    assert world.service.sweep() == 0
    world.clock.advance(1)

    assert world.service.sweep() == 1

    world.restart()
    stored = world.job(job.id)
    assert (stored.state, stored.deadline_at) == (JobState.RETRYING, None)
    assert stored.last_failure is not None
    assert stored.last_failure.reason == FailureReason.LEASE_EXPIRED
    for message in (run.ack, run.cancel_poll, lambda j, a: run.progress(j, a, 9)):
        with pytest.raises(LeaseExpired):
            message(job.id, attempt)
    with pytest.raises(LeaseExpired):
        run.result(job.id, attempt, "succeeded")
    assert stored == world.job(job.id)


def test_progress_renews_the_execution_lease(world: World) -> None:
    """Accepted progress moves the lease expiry, so a working attempt never expires."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    for seq in range(1, 6):
        world.clock.advance(world.settings.lease_ttl_ms - 1)
        run.progress(job.id, attempt, seq)
        assert world.service.sweep() == 0
    assert world.job(job.id).state == JobState.RUNNING


def test_old_attempt_arrives_late(world: World) -> None:
    """Messages and reconcile entries of an older attempt or lease change nothing."""
    job = world.submit()
    run = world.run().start()
    (first,) = run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)
    world.service.sweep()
    world.clock.advance(SECOND)
    (second,) = run.claim()
    run.ack(job.id, second.attempt)
    current = world.job(job.id)

    for late in (run.ack, run.cancel_poll, lambda j, a: run.progress(j, a, 1)):
        with pytest.raises(StaleAttempt):
            late(job.id, first.attempt)
    with pytest.raises(StaleAttempt):
        run.result(job.id, first.attempt, "succeeded")
    forged = Evidence(second.attempt, first.lease)
    with pytest.raises(LeaseMismatch):
        world.service.progress(run.session_id, job.id, forged, seq=1)
    assert current == world.job(job.id)

    run.result(job.id, second.attempt, "succeeded")
    terminal = world.job(job.id)
    report = world.service.reconcile(run.session_id, [run.entry(job.id, first.attempt)])
    assert [d.reason for d in report.discard] == [DiscardReason.TERMINAL]
    with pytest.raises(StaleAttempt):
        run.result(job.id, first.attempt, "failed", retryable=False)
    assert terminal == world.job(job.id)


def test_invalid_endpoint_or_session(world: World) -> None:
    """Another endpoint, a rotated or expired session, or an unknown key leave the job as is."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    evidence = run.evidence(job.id, attempt)
    before = world.job(job.id)

    intruder = world.run(world.other_endpoint).start()
    with pytest.raises(WrongEndpoint) as wrong:
        world.service.progress(intruder.session_id, job.id, evidence, seq=5)
    assert (wrong.value.status, wrong.value.code) == (403, "wrong_endpoint")
    for send in (world.service.ack, world.service.cancel_poll):
        with pytest.raises(WrongEndpoint):
            send(intruder.session_id, job.id, evidence)
    with pytest.raises(WrongEndpoint):
        world.service.result(
            intruder.session_id, job.id, evidence, outcome="succeeded", retryable=False
        )

    with pytest.raises(SignatureInvalid):
        world.service.progress("ses_forged", job.id, evidence, seq=5)

    rotated = run.session_id
    run.register()
    with pytest.raises(SessionRotated) as stale:
        world.service.progress(rotated, job.id, evidence, seq=5)
    assert (stale.value.status, stale.value.code) == (401, "session_rotated")

    world.clock.advance(world.settings.session_ttl_ms)
    with pytest.raises(SessionExpired):
        world.service.progress(run.session_id, job.id, evidence, seq=5)
    assert before == world.job(job.id)


# -- Requirement: Retry and terminal policy ---------------------------------------------------


def test_retry_waits_for_backoff(world: World) -> None:
    """A retryable failure records the next eligible time; no claim gets the job before it."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    answer = run.result(
        job.id, attempt, "failed", retryable=True, error={"code": "boom", "message": "x"}
    )

    assert (JobState.RETRYING, world.clock.now() + 1 * SECOND) == (
        answer.state,
        answer.next_eligible_at,
    )
    assert world.job(job.id).eligible_at == answer.next_eligible_at
    world.clock.advance(SECOND - 1)
    assert run.claim() == []
    world.clock.advance(1)
    (again,) = run.claim()
    run.ack(job.id, again.attempt)
    second = run.result(job.id, again.attempt, "failed", retryable=True)
    assert world.clock.now() + 2 * SECOND == second.next_eligible_at


def test_retry_claim_increments_attempt(world: World) -> None:
    """The next claim is attempt + 1 under a different lease; the old lease stops working."""
    job = world.submit()
    run = world.run().start()
    first = fail_retryably(world, job.id, run)
    world.clock.advance(SECOND)

    (granted,) = run.claim()

    assert first + 1 == granted.attempt
    assert run.leases[(job.id, first)] != granted.lease
    assert token_hash(granted.lease) == world.job(job.id).lease_hash
    with pytest.raises(StaleAttempt):
        world.service.ack(run.session_id, job.id, Evidence(first, run.leases[(job.id, first)]))


def test_retry_budget_is_exhausted(world: World) -> None:
    """A retryable failure on the last attempt ends the job failed; claims never return it."""
    job = world.submit(max_attempts=3)
    run = world.run().start()
    answers = []
    for _ in range(3):
        world.clock.advance(4 * SECOND)
        attempt = run.run_to_running(job.id)
        answers.append(run.result(job.id, attempt, "failed", retryable=True))

    assert [a.state for a in answers] == [JobState.RETRYING, JobState.RETRYING, JobState.FAILED]
    stored = world.job(job.id)
    assert stored.terminal is not None
    assert (stored.attempt, stored.terminal.attempt) == (3, 3)
    world.clock.advance(24 * 3600 * SECOND)
    assert world.run().start().claim(4) == []


def test_terminal_replay_conflicts(world: World) -> None:
    """The same fingerprint replays the stored answer; another fingerprint or attempt is refused."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    first = run.result(job.id, attempt, "succeeded", output={"rows": 3})
    stored = world.job(job.id)

    world.clock.advance(SECOND)
    replay = run.result(job.id, attempt, "succeeded", output={"rows": 3})

    assert (first.state, first.fingerprint, True) == (
        replay.state,
        replay.fingerprint,
        replay.replayed,
    )
    with pytest.raises(TerminalConflict):
        run.result(job.id, attempt, "succeeded", output={"rows": 4})
    with pytest.raises(TerminalConflict):
        run.result(job.id, attempt, "failed", retryable=True)
    with pytest.raises(StaleAttempt):
        world.service.result(
            run.session_id,
            job.id,
            Evidence(attempt + 1, run.leases[(job.id, attempt)]),
            outcome="succeeded",
            retryable=False,
            output={"rows": 3},
        )
    assert stored == world.job(job.id)


def test_retrying_result_replay_returns_the_stored_answer(world: World) -> None:
    """A retryable failure replayed while the job waits gets the same answer, marked replayed."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    first = run.result(job.id, attempt, "failed", retryable=True)
    replay = run.result(job.id, attempt, "failed", retryable=True)
    assert (first.next_eligible_at, True) == (replay.next_eligible_at, replay.replayed)


# -- Requirement: Idempotent durable cancellation ---------------------------------------------


def test_cancel_before_claim(world: World) -> None:
    """Queued and retry-wait jobs record intent and the cancelled result at once, unclaimed."""
    waiting = world.submit()
    fail_retryably(world, waiting.id)
    queued = world.submit()

    outcomes = [world.service.cancel_job(world.owner, j.id) for j in (queued, waiting)]

    for outcome in outcomes:
        job = outcome.job
        assert job.cancel is not None
        assert (
            job.state,
            job.cancel.result,
            outcome.waits_on_run,
        ) == (JobState.CANCELLED, CancelResult.CANCELLED, False)
        assert world.clock.now() == job.cancel.requested_at == job.cancel.resolved_at
    assert (world.job(queued.id).attempt, world.job(waiting.id).attempt) == (0, 1)
    world.clock.advance(3600 * SECOND)
    assert world.run().start().claim(4) == []


def test_cancel_after_claim(world: World) -> None:
    """Run's fenced polling sees the durable intent; its cancelled result completes it."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()

    outcome = world.service.cancel_job(world.helper, job.id)

    assert (outcome.job.state, outcome.waits_on_run) == (JobState.ACCEPTED, True)
    poll = run.cancel_poll(job.id, granted.attempt)
    assert (True, world.clock.now()) == (poll.cancel_requested, poll.requested_at)
    run.ack(job.id, granted.attempt)
    assert run.progress(job.id, granted.attempt, 1).cancel_requested is True
    answer = run.result(job.id, granted.attempt, "cancelled")
    stored = world.job(job.id)
    assert stored.cancel is not None
    assert (answer.state, stored.cancel.result) == (JobState.CANCELLED, CancelResult.CANCELLED)


def test_cancel_of_work_that_finishes_first_records_completed_first(world: World) -> None:
    """A success that beats the cancel ends succeeded, with cancel result completed_first."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    world.service.cancel_job(world.owner, job.id)

    run.result(job.id, attempt, "succeeded")

    stored = world.job(job.id)
    assert stored.cancel is not None
    assert (
        stored.state,
        stored.cancel.result,
    ) == (JobState.SUCCEEDED, CancelResult.COMPLETED_FIRST)


def test_cancelled_result_without_intent_is_refused(world: World) -> None:
    """Run cannot report cancelled unless a user asked for it."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    before = world.job(job.id)
    with pytest.raises(NoCancelIntent):
        run.result(job.id, attempt, "cancelled")
    assert before == world.job(job.id)


def test_cancel_is_repeated(world: World) -> None:
    """Repeated cancels and polls return the existing intent and result, creating nothing new."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    first = world.service.cancel_job(world.owner, job.id).job
    world.clock.advance(SECOND)

    again = world.service.cancel_job(world.admin, job.id).job
    polls = {run.cancel_poll(job.id, attempt) for _ in range(3)}

    assert first == again
    assert len(polls) == 1
    run.result(job.id, attempt, "failed", retryable=True)
    done = world.job(job.id)
    assert (done.state, done.attempt) == (JobState.CANCELLED, 1)
    assert done == world.service.cancel_job(world.owner, job.id).job
    assert run.claim(4) == []


def test_cross_owner_cancellation_is_denied(world: World) -> None:
    """A user who neither owns nor administers the server gets forbidden; no intent persists."""
    job = world.submit()
    before = world.job(job.id)

    with pytest.raises(Forbidden) as denied:
        world.service.cancel_job(world.stranger, job.id)

    assert (denied.value.status, denied.value.code) == (403, "forbidden")
    assert before == world.job(job.id)
    with pytest.raises(NotFound):
        world.service.cancel_job(world.stranger, "job_nosuchjob")


# -- Requirement: Run restart and platform reconciliation -------------------------------------


def test_run_restart_resumes_confirmed_attempt(world: World) -> None:
    """After re-registering, reconcile confirms and rebinds the attempt before any new claim."""
    job = world.submit()
    later = world.submit()
    run = world.run().start(capacity=2)
    attempt = run.run_to_running(job.id)

    assert run.register(capacity=2, boot_id="boot-2") == 2
    with pytest.raises(ReconcileRequired):
        run.claim()
    with pytest.raises(ReconcileRequired):
        run.progress(job.id, attempt, 1)

    report = world.service.reconcile(run.session_id, [run.entry(job.id, attempt)])

    assert [(job.id, attempt, JobState.RUNNING)] == [
        (c.job_id, c.attempt, c.state) for c in report.confirmed
    ]
    assert (list(report.discard), list(report.lost)) == ([], [])
    stored = world.job(job.id)
    assert stored.reconcile is not None
    assert (
        stored.session_generation,
        stored.reconcile.outcome,
        stored.reconcile.generation,
    ) == (2, ReconcileOutcome.CONFIRMED, 2)
    assert world.clock.now() + world.settings.lease_ttl_ms == report.confirmed[0].deadline
    run.progress(job.id, attempt, 1)
    assert [later.id] == [c.job_id for c in run.claim(4)]
    assert run.result(job.id, attempt, "succeeded").state == JobState.SUCCEEDED


def test_run_reports_stale_journal_entry(world: World) -> None:
    """Terminal, unknown, foreign, wrong-attempt and wrong-lease entries are discarded."""
    done, waiting, live = world.submit(), world.submit(), world.submit()
    foreign = world.submit(server=world.other_server, actor=world.stranger)
    run = world.run().start(capacity=1)
    done_attempt = run.run_to_running(done.id)
    run.result(done.id, done_attempt, "succeeded")
    waiting_attempt = run.run_to_running(waiting.id)
    run.result(waiting.id, waiting_attempt, "failed", retryable=True)
    live_attempt = run.run_to_running(live.id)
    other_run = world.run(world.other_endpoint).start()
    (foreign_grant,) = other_run.claim()
    before = {j.id: world.job(j.id) for j in (done, waiting, foreign)}

    entries = [
        run.entry(done.id, done_attempt),
        ReconcileEntry("job_unknown", 1, "mrl_whatever"),
        ReconcileEntry(foreign.id, foreign_grant.attempt, foreign_grant.lease),
        ReconcileEntry(waiting.id, waiting_attempt + 1, run.leases[(waiting.id, waiting_attempt)]),
        ReconcileEntry(live.id, live_attempt, "mrl_not-the-lease"),
    ]
    run.register(capacity=1, boot_id="boot-2")
    report = world.service.reconcile(run.session_id, entries)

    assert [
        (done.id, DiscardReason.TERMINAL),
        ("job_unknown", DiscardReason.UNKNOWN),
        (foreign.id, DiscardReason.WRONG_ENDPOINT),
        (waiting.id, DiscardReason.WRONG_ATTEMPT),
        (live.id, DiscardReason.WRONG_LEASE),
    ] == [(d.job_id, d.reason) for d in report.discard]
    assert list(report.confirmed) == []
    assert [(live.id, JobState.RETRYING)] == [(lost.job_id, lost.state) for lost in report.lost]
    assert before == {j.id: world.job(j.id) for j in (done, waiting, foreign)}
    not_active = world.service.reconcile(run.session_id, [run.entry(waiting.id, waiting_attempt)])
    assert [d.reason for d in not_active.discard] == [DiscardReason.NOT_ACTIVE]
    assert world.job(waiting.id).state == JobState.RETRYING


def test_platform_restart_accepts_reconciliation(world: World) -> None:
    """A restarted platform validates Run's journal against the store alone."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)

    world.restart()
    same_session = world.service.reconcile(run.session_id, [run.entry(job.id, attempt)])
    run.register(boot_id="boot-2")
    new_session = world.service.reconcile(run.session_id, [run.entry(job.id, attempt)])

    assert [job.id] == [c.job_id for c in same_session.confirmed]
    assert [(job.id, attempt)] == [(c.job_id, c.attempt) for c in new_session.confirmed]
    assert world.job(job.id).session_generation == 2
    assert run.result(job.id, attempt, "succeeded").state == JobState.SUCCEEDED


def test_platform_active_work_is_missing_from_run(world: World) -> None:
    """Active jobs the report omits are recorded lost and go to cancel or retry policy."""
    accepted, running, last_try = world.submit(), world.submit(), world.submit(max_attempts=1)
    run = world.run().start(capacity=3)
    grants = {g.job_id: g for g in run.claim(3)}
    run.ack(running.id, grants[running.id].attempt)
    run.ack(last_try.id, grants[last_try.id].attempt)
    world.service.cancel_job(world.owner, running.id)

    run.register(capacity=3, boot_id="boot-2")
    report = world.service.reconcile(run.session_id, [])

    assert {
        accepted.id: JobState.RETRYING,
        running.id: JobState.CANCELLED,
        last_try.id: JobState.FAILED,
    } == {lost.job_id: lost.state for lost in report.lost}
    for job_id in (accepted.id, running.id, last_try.id):
        stored = world.job(job_id)
        assert stored.reconcile is not None
        assert stored.last_failure is not None
        assert (
            stored.reconcile.outcome,
            stored.last_failure.reason,
        ) == (ReconcileOutcome.LOST, FailureReason.RECONCILE_LOST)


# -- Requirement: Credential-free user projection ---------------------------------------------


def test_authorized_user_reads_job_scheduling_status(world: World) -> None:
    """Owner, server administrator and platform admin read the safe scheduling fields."""
    job = world.submit(payload={"secret_ref": "vault:canary-payload"})
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    run.progress(job.id, attempt, 1, percent=50.0, message="half")
    world.service.cancel_job(world.owner, job.id)
    lease = run.leases[(job.id, attempt)]

    for reader in (world.owner, world.helper, world.admin):
        view = job_view(world.service.get_job(reader, job.id))
        assert (view["attempt"], view["max_attempts"], view["state"]) == (1, 3, "running")
        assert view["progress"] is not None
        assert (view["progress"]["percent"], view["cancel"]["requested"]) == (50.0, True)
        assert {"next_eligible_at", "initial_s", "multiplier", "max_s", "last_failure"} == set(
            view["retry"]
        )
        assert {"outcome", "at"} == set(view["reconcile"])
        text = repr(view)
        for secret in (lease, token_hash(lease), "canary-payload", run.session_id):
            assert secret not in text


def test_unauthorized_user_reads_another_owners_job(world: World) -> None:
    """Without access a job is forbidden, a missing one not found, and lists leave it out."""
    job = world.submit()

    with pytest.raises(Forbidden):
        world.service.get_job(world.stranger, job.id)
    with pytest.raises(NotFound):
        world.service.get_job(world.stranger, "job_missing")
    with pytest.raises(Forbidden):
        world.service.list_jobs(world.stranger, server_id=world.server.id)
    assert [j.id for j in world.service.list_jobs(world.stranger).jobs] == []
    assert [job.id] == [j.id for j in world.service.list_jobs(world.helper).jobs]
