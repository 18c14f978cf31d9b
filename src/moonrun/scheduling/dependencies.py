"""Dependencies: a job that waits until other jobs (and every job of a group) have succeeded.

Pure: the checks of what a job may name, and what becomes of a waiting job given the states
of what it waits on. A job with dependencies is made **held** (queued, not claimable: the
fan-out groups' mechanism, `Job.claimable_at`); once everything it names has succeeded it is
released, and once one of them ended failed or cancelled it ends `cancelled` with the error
`dependency_failed` naming it (docs/protocol.md, "Dependencies"). Only existing jobs can be
named, so no cycle can form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from moonrun.errors import InvalidRequest
from moonrun.scheduling.jobs import (
    ErrorInfo,
    Event,
    Job,
    JobState,
    Outcome,
    finish,
)
from moonrun.scheduling.time import Instant

MAX_AFTER: Final = 100
"""Most jobs one job may wait on."""

DEPENDENCY_FAILED: Final = "dependency_failed"
"""The terminal error code of a job cancelled because something it waited on did not succeed."""

_FAILED: Final = frozenset({JobState.FAILED, JobState.CANCELLED})


def check_after(after: object, after_group: object) -> tuple[tuple[str, ...], str | None]:
    """The shape of `after` (a list of at most MAX_AFTER job ids, each once) and
    `after_group` (a group id or None), as values; 422 naming the field otherwise."""
    if after is None:
        after = []
    if not isinstance(after, (list, tuple)) or not all(isinstance(i, str) for i in after):
        raise InvalidRequest(
            "after must be a list of job ids", fields=(("after", "must be a list of job ids"),)
        )
    if len(after) > MAX_AFTER:
        raise InvalidRequest(
            f"after names at most {MAX_AFTER} jobs",
            fields=(("after", f"names at most {MAX_AFTER} jobs"),),
        )
    for index, job_id in enumerate(after):
        if after.index(job_id) != index:
            raise InvalidRequest(
                f"after[{index}]: named twice", fields=((f"after[{index}]", "named twice"),)
            )
    if after_group is not None and not isinstance(after_group, str):
        raise InvalidRequest(
            "after_group must be a group id", fields=(("after_group", "must be a group id"),)
        )
    return tuple(after), after_group


def waits(job: Job) -> bool:
    """The job is held on its dependencies (queued, named some, not released yet)."""
    return job.dependency_held


def settle(
    job: Job,
    states: Mapping[str, JobState],
    group_counts: Mapping[JobState, int] | None,
    now: Instant,
) -> Job:
    """What becomes of a waiting job, given the states of the jobs it names (`states`; one
    missing was deleted, which only a finished job can be) and its group's counts by state
    (None when it names no group): cancelled with `dependency_failed` once one of them ended
    failed or cancelled (or was deleted), released once every one succeeded, else the very
    record (settling twice changes nothing)."""
    if not waits(job):
        return job
    for job_id in job.after:
        state = states.get(job_id)
        if state in _FAILED:
            return dependency_failed(job, f"job {job_id} ended {state}", now)
        if state is None:  # deleted: only a finished job can be, and it can no longer tell
            return dependency_failed(job, f"job {job_id} was deleted", now)
    if job.after_group is not None:
        counts = group_counts or {}
        for state in (JobState.FAILED, JobState.CANCELLED):
            if counts.get(state):
                return dependency_failed(
                    job, f"group {job.after_group}: a job of it ended {state}", now
                )
    if any(states.get(job_id) is not JobState.SUCCEEDED for job_id in job.after):
        return job
    if job.after_group is not None and not group_succeeded(group_counts):
        return job
    return job.unheld(now)


def group_succeeded(counts: Mapping[JobState, int] | None) -> bool:
    """Every job of the group (it has some) succeeded."""
    return bool(counts) and all(
        state is JobState.SUCCEEDED for state, n in (counts or {}).items() if n
    )


def dependency_failed(job: Job, message: str, now: Instant) -> Job:
    """The waiting job ended `cancelled`, its terminal error naming what did not succeed."""
    return finish(
        job,
        Event.DEPENDENCY_FAILED,
        Outcome.CANCELLED,
        now,
        error=ErrorInfo(DEPENDENCY_FAILED, message),
    )


def named(jobs: Sequence[Job]) -> list[str]:
    """Every id the jobs wait on (jobs and groups), once each."""
    found: dict[str, None] = {}
    for job in jobs:
        for job_id in job.after:
            found[job_id] = None
        if job.after_group is not None:
            found[job.after_group] = None
    return list(found)
