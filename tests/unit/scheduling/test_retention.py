"""Retention's rule (scheduling/retention.py): only a finished job, and only once it ended
`retain_ms` ago or more, may be pruned; a user may delete any finished job; 0 keeps them all."""

from __future__ import annotations

import pytest

from moonrun.scheduling import retention
from moonrun.scheduling.jobs import Job, JobState
from tests.support.jobkit import T0, accepted, accepted_job, queued_job, reported, running_job
from tests.support.jobkit import send_result as result_of

DAY = retention.DAY_MS
ENDED = T0 + 2_000


def succeeded() -> Job:
    return accepted(result_of(running_job(), reported(), now=ENDED), JobState.SUCCEEDED)


@pytest.mark.parametrize("build", [queued_job, accepted_job, running_job])
def test_a_job_that_has_not_ended_is_never_prunable_nor_deletable(build: object) -> None:
    job = build()  # type: ignore[operator]
    far = T0 + 1000 * DAY

    assert (retention.prunable(job, far, DAY), retention.deletable(job, far)) == (False, False)


def test_a_finished_job_is_prunable_from_exactly_its_retention_after_it_ended() -> None:
    job = succeeded()

    assert retention.ended_at(job) == ENDED
    assert retention.prunable(job, ENDED + DAY - 1, DAY) is False
    assert retention.prunable(job, ENDED + DAY, DAY) is True
    assert retention.deletable(job, ENDED) is True


def test_retention_zero_keeps_finished_jobs_forever() -> None:
    job = succeeded()

    assert retention.prune_before(ENDED + 1000 * DAY, 0) is None
    assert retention.prunable(job, ENDED + 1000 * DAY, 0) is False
