"""The service's bounds on fencing, in process with a manual clock (docs/protocol.md, "Claims",
"Sending logs").

Logs and artifacts of an attempt are accepted while it is active and for exactly
`transfer_grace_s` after it ends, however it ended; one millisecond later they are refused.
A claim never grants more than `max_claim_batch` jobs, whatever Run asks for and has room for;
one that grants nothing says when to look again. Every committed change is told once. Each
test is named for a bound a mutation run once broke without any suite noticing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from moonrun.errors import AckDeadlineExpired, MoonrunError, NotActive, StaleAttempt
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.messages import Evidence
from tests.support.harness import SETTINGS, Run, World
from tests.support.http_harness import http_world
from tests.support.stores import memory_factory

GRACE_MS = 60_000
"""The documented grace (docs/protocol.md, "Sending logs"), written out: a changed default fails."""


def world_with(**settings: float) -> World:
    """A world whose sessions outlive the grace window (no heartbeats needed to look past it)."""
    return World(memory_factory(), replace(SETTINGS, session_ttl_s=600, **settings))


def running_attempt(world: World) -> tuple[Run, str, int]:
    """A Run holding one acked attempt: (run, job id, attempt)."""
    job = world.submit()
    run = world.run().start()
    return run, job.id, run.run_to_running(job.id)


def transfer(world: World, run: Run, job_id: str, attempt: int) -> JobState:
    """May `run` send logs or artifacts for the attempt now? Its state when it may."""
    return world.service.check_transfer(run.session_id, job_id, run.evidence(job_id, attempt)).state


def at(world: World, instant: int) -> None:
    """Move the manual clock forward to `instant`."""
    world.clock.advance(instant - world.clock.now())


@pytest.fixture
def world() -> World:
    return world_with()


def test_transfers_are_accepted_until_exactly_the_grace_after_a_result(world: World) -> None:
    """After a result, transfers pass up to and including ended + grace, not 1 ms later."""
    run, job_id, attempt = running_attempt(world)
    run.result(job_id, attempt, "succeeded")
    ended = world.clock.now()

    at(world, ended + GRACE_MS)
    assert transfer(world, run, job_id, attempt) == JobState.SUCCEEDED
    at(world, ended + GRACE_MS + 1)
    with pytest.raises(NotActive):
        transfer(world, run, job_id, attempt)


def test_transfers_are_accepted_just_after_an_attempt_ends(world: World) -> None:
    """The grace window is not empty: a log batch 1 ms after the result still lands."""
    run, job_id, attempt = running_attempt(world)
    run.result(job_id, attempt, "failed", retryable=True, error={"code": "x", "message": "y"})
    world.clock.advance(1)
    assert transfer(world, run, job_id, attempt) == JobState.RETRYING


def test_the_grace_after_a_passed_lease_counts_from_the_deadline(world: World) -> None:
    """A lease that lapsed unapplied: accepted until deadline + grace, then not_active."""
    run, job_id, attempt = running_attempt(world)
    deadline = world.job(job_id).lease_expires_at
    assert deadline is not None

    at(world, deadline)  # passed, and nothing applied it yet
    assert transfer(world, run, job_id, attempt) == JobState.RUNNING
    at(world, deadline + GRACE_MS)
    assert transfer(world, run, job_id, attempt) == JobState.RUNNING
    at(world, deadline + GRACE_MS + 1)
    with pytest.raises(NotActive):  # a check never writes, so no lease_expired is recorded
        transfer(world, run, job_id, attempt)


def test_the_grace_after_a_swept_deadline_counts_from_the_sweep(world: World) -> None:
    """An ack deadline the sweeper applied: accepted until sweep + grace, then its code."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    world.clock.advance(world.settings.ack_timeout_ms + 5)
    assert world.service.sweep() == 1
    swept = world.clock.now()

    at(world, swept + GRACE_MS)
    assert transfer(world, run, job.id, granted.attempt) == JobState.RETRYING
    at(world, swept + GRACE_MS + 1)
    with pytest.raises(AckDeadlineExpired):
        transfer(world, run, job.id, granted.attempt)


def test_transfers_of_an_active_attempt_need_no_grace() -> None:
    """With no grace at all, a running attempt still sends logs; its end closes them at once."""
    world = world_with(transfer_grace_s=0)
    run, job_id, attempt = running_attempt(world)
    assert transfer(world, run, job_id, attempt) == JobState.RUNNING
    run.result(job_id, attempt, "succeeded")
    assert transfer(world, run, job_id, attempt) == JobState.SUCCEEDED  # ended + 0
    world.clock.advance(1)
    with pytest.raises(NotActive):
        transfer(world, run, job_id, attempt)


def test_the_transfer_grace_follows_its_setting() -> None:
    """transfer_grace_s=5 closes transfers 5 s after the end, not at the default 60 s."""
    world = world_with(transfer_grace_s=5)
    run, job_id, attempt = running_attempt(world)
    run.result(job_id, attempt, "succeeded")
    ended = world.clock.now()
    at(world, ended + 5000)
    assert transfer(world, run, job_id, attempt) == JobState.SUCCEEDED
    at(world, ended + 5001)
    with pytest.raises(NotActive):
        transfer(world, run, job_id, attempt)


def test_a_stale_attempt_sends_no_transfers_even_within_the_grace(world: World) -> None:
    """Within the grace window, the evidence still has to be the current attempt's."""
    job = world.submit()
    run = world.run().start()
    (first,) = run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)
    world.service.sweep()
    world.clock.advance_s(world.settings.backoff_initial_s)
    (second,) = run.claim()
    assert (first.attempt, second.attempt) == (1, 2)
    with pytest.raises(StaleAttempt):
        transfer(world, run, job.id, first.attempt)


# -- the claim batch cap ---------------------------------------------------------------------


def test_a_claim_never_grants_more_than_max_claim_batch() -> None:
    """Room for 10 and 10 asked, with max_claim_batch=3: each claim grants 3."""
    world = world_with(max_claim_batch=3)
    for _ in range(10):
        world.submit()
    run = world.run().start(capacity=10)
    assert [len(run.claim(10)) for _ in range(4)] == [3, 3, 3, 1]


def test_the_default_claim_batch_cap_is_64() -> None:
    """docs/protocol.md, "Claims": at most min(max_jobs, capacity - active, 64) per claim."""
    world = world_with()
    for _ in range(70):
        world.submit()
    run = world.run().start(capacity=1000)
    assert [len(run.claim(1000)) for _ in range(2)] == [64, 6]


def test_log_batches_and_artifact_chunks_close_exactly_at_the_grace(tmp_path: Path) -> None:
    """Over HTTP: a log batch and a chunk at ended + 60 s are 202; 1 ms later 409 not_active."""
    with http_world(memory_factory(), tmp_path) as cast:
        world, run = cast.world, cast.run.start()
        job_id = world.submit(cast.server_id, cast.owner[1])["id"]
        attempt = run.run_to_running(job_id)
        assert run.result(job_id, attempt).status_code == 200
        ended = world.clock.now()
        world.clock.advance(GRACE_MS // 2)
        assert run.heartbeat().status_code == 200  # the session outlives the grace

        world.clock.advance(ended + GRACE_MS - world.clock.now())
        inside = (
            run.send_logs(job_id, attempt, 0, "last words").status_code,
            run.put_chunk(job_id, attempt, "out.txt", 0, b"bytes", final=True).status_code,
        )
        world.clock.advance(1)
        late_log = run.send_logs(job_id, attempt, 1, "too late")
        late_chunk = run.put_chunk(job_id, attempt, "late.txt", 0, b"bytes", final=True)
        outside = (late_log.status_code, late_log.json()["error"]["code"])
        outside_chunk = (late_chunk.status_code, late_chunk.json()["error"]["code"])

    assert inside == (202, 202)
    assert outside == (409, "not_active")
    assert outside_chunk == (409, "not_active")


# -- claims, sessions and events: the service's fencing paths ---------------------------------


class Recorded:
    """A JobEvents listener: every committed change, as (job id, state before, state after)."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str | None, str]] = []

    def job_changed(self, job: Job, before: Job | None) -> None:
        self.changes.append((job.id, before.state.value if before else None, job.state.value))


def test_a_claim_that_grants_nothing_says_when_to_look_again(world: World) -> None:
    """Nothing waiting: no time; a job due later: its time; full or draining: no time."""
    run = world.run().start(capacity=1)
    nothing = world.service.claim_now(run.session_id, 1)
    later = world.submit(not_before=world.clock.now() + 5000)
    waiting = world.service.claim_now(run.session_id, 1)
    world.clock.advance(5000)
    granted = world.service.claim_now(run.session_id, 1)
    world.submit()
    full = world.service.claim_now(run.session_id, 1)
    world.service.set_draining(world.admin, world.endpoint.id, True)
    draining = world.service.claim_now(run.session_id, 1)

    ep = world.endpoint.id
    found = [
        (claim.jobs == [], claim.endpoint_id, claim.next_claimable_at)
        for claim in (nothing, waiting, full, draining)
    ]
    assert found == [
        (True, ep, None),
        (True, ep, later.eligible_at),
        (True, ep, None),
        (True, ep, None),
    ]
    assert ([job.job_id for job in granted.jobs], granted.endpoint_id) == ([later.id], ep)
    assert granted.next_claimable_at is None


def test_every_committed_job_change_is_told_once_with_the_record_before(world: World) -> None:
    """Claim, ack, a refused ack, progress, a swept lease: each change once, none for a refusal."""
    events = Recorded()
    world.service.listen(events)
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    run.ack(job.id, granted.attempt)
    with pytest.raises(StaleAttempt):
        world.service.ack(run.session_id, job.id, Evidence(granted.attempt + 1, "mrl_x"))
    run.progress(job.id, granted.attempt, 1)
    world.clock.advance(world.settings.lease_ttl_ms)
    world.service.sweep()

    assert events.changes == [
        (job.id, None, "queued"),
        (job.id, "queued", "accepted"),
        (job.id, "accepted", "running"),
        (job.id, "running", "running"),
        (job.id, "running", "retrying"),
    ]


def test_reconciling_tells_each_job_it_changed_once(world: World) -> None:
    """A new session confirms one held attempt and loses one it did not report."""
    kept, dropped = world.submit(), world.submit()
    run = world.run().start()
    run.claim(2)
    events = Recorded()
    world.service.listen(events)
    run.register()
    world.service.reconcile(run.session_id, [run.entry(kept.id, 1)])
    assert sorted(events.changes) == sorted(
        [(kept.id, "accepted", "accepted"), (dropped.id, "accepted", "retrying")]
    )


def test_reconciling_an_acked_nothing_renews_its_ack_deadline(world: World) -> None:
    """A claimed attempt confirmed by a new session: bound to it, its ack deadline from now."""
    job = world.submit()
    run = world.run().start()
    run.claim()
    world.clock.advance(10_000)
    generation = run.register()
    world.service.reconcile(run.session_id, [run.entry(job.id, 1)])
    stored = world.job(job.id)
    expected = (generation, world.clock.now() + world.settings.ack_timeout_ms)
    assert (stored.session_generation, stored.ack_deadline) == expected


def test_a_batch_answers_an_unknown_job_and_still_every_entry_after_it(world: World) -> None:
    """acks for [no such job, a real one]: job_not_found, then the real answer, in order."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    answers = world.service.ack_many(
        run.session_id,
        [("job_missing", run.evidence(job.id, 1)), (job.id, run.evidence(job.id, 1))],
    )
    kinds = [type(answer).__name__ for answer in answers]
    assert (kinds, granted.attempt) == (["JobNotFound", "AckAnswer"], 1)


def test_a_claim_asks_for_one_to_two_to_the_31_jobs_and_only_after_reconciling(
    world: World,
) -> None:
    """max_jobs out of range and a claim before reconciling: refusals that say so."""
    run = world.run()
    run.register()
    early = refusal(lambda: world.service.claim(run.session_id, 1))
    world.service.reconcile(run.session_id, [])
    bounds = [refusal(lambda n=n: world.service.claim(run.session_id, n)) for n in (0, 2**31 + 1)]
    assert world.service.claim(run.session_id, 2**31) == []
    assert early == ("ReconcileRequired", "reconcile after registering, before claiming")
    assert bounds == [("InvalidRequest", "max_jobs must be an integer from 1 to 2147483648")] * 2


def refusal(call: Any) -> tuple[str, str]:
    try:
        call()
    except MoonrunError as error:
        return type(error).__name__, error.message
    raise AssertionError("accepted")


def test_a_session_is_rewritten_only_when_less_than_half_its_ttl_is_left(world: World) -> None:
    """Activity while more than half the session's TTL is left leaves the stored session (an
    idle fleet writes nothing); once less is left it moves (last seen and expiry), and the
    heartbeat answers the expiry the store holds (issue 24; tests/unit/service/test_idle_fleet.py
    has the heartbeats' shared commit)."""
    run = world.run().start()
    registered = world.store.get_session(run.session_id)
    assert registered is not None
    ttl = world.settings.session_ttl_ms
    world.clock.advance(ttl // 2 - 1)
    early = run.heartbeat()
    unchanged = world.store.get_session(run.session_id)
    world.clock.advance(2)
    moved = run.heartbeat()
    rewritten = world.store.get_session(run.session_id)
    assert unchanged is not None
    assert rewritten is not None
    now = world.clock.now()
    assert (unchanged.expires_at, early.session_expires_at) == (registered.expires_at,) * 2
    assert rewritten.last_seen_at == now
    assert rewritten.expires_at > registered.expires_at
    assert moved.session_expires_at == rewritten.expires_at


def test_an_unknown_session_is_signature_invalid_saying_so(world: World) -> None:
    """A session id the store does not have: signature_invalid, `unknown session`."""
    assert refusal(lambda: world.service.heartbeat("ses_nope")) == (
        "SignatureInvalid",
        "unknown session",
    )


def test_reading_a_job_whose_lease_lapsed_applies_the_lapse_with_its_backoff(world: World) -> None:
    """A user's read after the lease passed: retrying, eligible after the first backoff."""
    job = world.submit()
    run = world.run().start()
    run.run_to_running(job.id)
    world.clock.advance(world.settings.lease_ttl_ms)
    seen = world.service.get_job(world.owner, job.id)
    expected = (
        JobState.RETRYING,
        world.clock.now() + round(world.settings.backoff_initial_s * 1000),
    )
    assert (seen.state, seen.eligible_at) == expected


def test_transfers_after_the_grace_are_refused_saying_the_attempt_ended(world: World) -> None:
    """The refusal's words: the attempt ended; its logs and artifacts are closed."""
    run, job_id, attempt = running_attempt(world)
    run.result(job_id, attempt, "succeeded")
    world.clock.advance(GRACE_MS + 1)
    assert refusal(lambda: transfer(world, run, job_id, attempt)) == (
        "NotActive",
        "the attempt ended; its logs and artifacts are closed",
    )
