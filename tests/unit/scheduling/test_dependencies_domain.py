"""The pure rules of dependencies (scheduling/dependencies.py): a job naming others is made held;
`settle` releases it once all succeeded, cancels it with `dependency_failed` once one did not,
and otherwise leaves the very record; what may be named is checked, naming the field."""

from __future__ import annotations

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling import dependencies as domain
from moonrun.scheduling.jobs import Job, JobState, create_job
from tests.support.jobkit import ENDPOINT, POLICY, T0

S, F, C, R = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RUNNING


def waiting(after: tuple[str, ...] = ("job-a", "job-b"), group: str | None = None) -> Job:
    return create_job(
        job_id="job-w",
        server_id="srv-1",
        endpoint_id=ENDPOINT,
        owner_id="usr-1",
        kind="noop",
        payload={},
        policy=POLICY,
        now=T0,
        after=after,
        after_group=group,
    )


def test_a_job_naming_dependencies_is_made_held_and_not_claimable() -> None:
    job = waiting()
    assert job.held
    assert job.dependency_held
    assert job.claimable_at is None
    assert job.waits_on == ("job-a", "job-b")
    assert waiting(group="grp_x").waits_on == ("job-a", "job-b", "grp_x")


def test_settle_waits_until_every_named_job_succeeded_then_releases() -> None:
    job = waiting()
    assert domain.settle(job, {"job-a": S, "job-b": R}, None, T0 + 5) is job
    assert domain.settle(job, {"job-a": S, "job-b": JobState.QUEUED}, None, T0 + 5) is job
    released = domain.settle(job, {"job-a": S, "job-b": S}, None, T0 + 5)
    assert not released.held
    assert released.state is JobState.QUEUED
    assert released.claimable_at == T0 + 5
    # Settling the released job again changes nothing.
    assert domain.settle(released, {"job-a": F}, None, T0 + 6) is released


@pytest.mark.parametrize("ended", [F, C])
def test_one_dependency_that_did_not_succeed_cancels_the_job_naming_it(ended: JobState) -> None:
    job = domain.settle(waiting(), {"job-a": R, "job-b": ended}, None, T0 + 5)
    assert job.state is JobState.CANCELLED
    assert job.terminal is not None
    assert job.terminal.error is not None
    assert job.terminal.error.code == domain.DEPENDENCY_FAILED
    assert job.terminal.error.message == f"job job-b ended {ended}"


def test_a_group_releases_once_every_job_of_it_succeeded_and_cancels_on_one_failure() -> None:
    job = waiting(after=(), group="grp_x")
    assert domain.settle(job, {}, {S: 2, R: 1}, T0 + 5) is job
    assert domain.settle(job, {}, {}, T0 + 5) is job
    assert not domain.settle(job, {}, {S: 3}, T0 + 5).held
    cancelled = domain.settle(job, {}, {S: 1, F: 1, R: 1}, T0 + 5)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.terminal is not None
    assert cancelled.terminal.error is not None
    assert "grp_x" in cancelled.terminal.error.message


def test_what_may_be_named_is_checked_naming_the_field() -> None:
    assert domain.check_after(["job-a"], "grp_x") == (("job-a",), "grp_x")
    assert domain.check_after(None, None) == ((), None)
    cases = [
        (["job-a"] * 2, None, "after[1]"),
        ([f"job-{n}" for n in range(domain.MAX_AFTER + 1)], None, "after"),
        ("job-a", None, "after"),
        ([1], None, "after"),
        ([], 5, "after_group"),
    ]
    for after, group, field in cases:
        with pytest.raises(InvalidRequest) as refused:
            domain.check_after(after, group)
        assert refused.value.fields[0][0] == field


def test_a_deleted_dependency_cancels_the_job_naming_it() -> None:
    job = domain.settle(waiting(), {"job-a": S}, None, T0 + 5)
    assert job.state is JobState.CANCELLED
    assert job.terminal is not None
    assert job.terminal.error is not None
    assert job.terminal.error.message == "job job-b was deleted"
