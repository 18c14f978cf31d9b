"""The service's bounds on fencing, in process with a manual clock (docs/protocol.md 9, 23).

Logs and artifacts of an attempt are accepted while it is active and for exactly
`transfer_grace_s` after it ends, however it ended; one millisecond later they are refused.
A claim never grants more than `max_claim_batch` jobs, whatever Run asks for and has room for.
Each test is named for a bound a mutation run once broke without any suite noticing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from moonrun.errors import AckDeadlineExpired, NotActive, StaleAttempt
from moonrun.scheduling.jobs import JobState
from tests.harness import SETTINGS, Run, World
from tests.http_harness import http_world
from tests.stores import memory_factory

GRACE_MS = 60_000
"""The documented grace (docs/protocol.md 23), written out: a changed default must fail here."""


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
    """docs/protocol.md 9: at most min(max_jobs, capacity - active, 64) per claim."""
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
