"""Retention: which finished jobs may be deleted, by the sweeper (when old enough) or by a user.

Pure: jobs and `now` in, answers out. Deleting a job also deletes its attempts (its history),
its idempotency record, its log lines and its artifacts; the service and the stores carry that
out, this module only says whether a job may go.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from moonrun.scheduling.jobs import Job
from moonrun.scheduling.time import Instant

DAY_MS: Final = 24 * 3600 * 1000
DEFAULT_RETAIN_FINISHED_MS: Final = 30 * DAY_MS
"""Finished jobs are kept this long after they ended (`--retain-finished`, default 30 days)."""
PRUNE_BATCH_LIMIT: Final = 1000
"""Never more jobs than this in one deleting transaction, whatever the settings say."""


def ended_at(job: Job) -> Instant | None:
    """When a finished job ended (None while it has not)."""
    if not job.state.is_terminal:
        return None
    return job.terminal.at if job.terminal is not None else job.updated_at


def still_needed(
    job: Job,
    now: Instant,
    unfinished_groups: Collection[str] = (),
    awaited: Collection[str] = (),
) -> bool:
    """Whether something that is not over yet still needs this finished job.

    The one place to say so, so that neither the sweeper nor a user's DELETE removes what
    something still reads. A fan-out group's jobs stay while any job of the group has not
    ended (`unfinished_groups`, the ids of such groups among the jobs asked about): its counts
    and whether it is done are read from its jobs. A job (or a group's jobs) that a job still
    held on its dependencies waits on stays until that job is settled (`awaited`, the ids of
    such jobs and groups among those asked about): its settling reads their states. A schedule
    needs none: its overlap check reads its last firing's job only to ask whether it is still
    running (a finished job, or a deleted one, is not), each time fires once by the schedule's
    own compare-and-swap whatever became of the job, and its view shows no `job_state` once
    the job is gone.
    """
    if job.id in awaited:
        return True
    return job.group_id is not None and (
        job.group_id in unfinished_groups or job.group_id in awaited
    )


def deletable(
    job: Job,
    now: Instant,
    unfinished_groups: Collection[str] = (),
    awaited: Collection[str] = (),
) -> bool:
    """A user may delete the job now: it has ended and nothing still needs it."""
    return job.state.is_terminal and not still_needed(job, now, unfinished_groups, awaited)


def prune_before(now: Instant, retain_ms: int) -> Instant | None:
    """Jobs that ended at or before this instant are old enough to prune; None when retention
    is off (`retain_ms` 0 keeps finished jobs forever)."""
    return None if retain_ms <= 0 else now - retain_ms


def prunable(
    job: Job,
    now: Instant,
    retain_ms: int,
    unfinished_groups: Collection[str] = (),
    awaited: Collection[str] = (),
) -> bool:
    """The sweeper may delete the job: deletable, and it ended at least `retain_ms` ago."""
    before = prune_before(now, retain_ms)
    end = ended_at(job)
    return (
        before is not None
        and end is not None
        and end <= before
        and deletable(job, now, unfinished_groups, awaited)
    )
