"""Fan-out groups: one job on each matching server, made together, read and cancelled together.

Pure: the group record, its option checks, which of its new jobs start held, how many held
jobs may be released, and whether a job's end stops the group. `max_parallel` is kept by
holding jobs: a held job is queued but not claimable (`Job.claimable_at` is None), and a
group never has more than `max_parallel` jobs that are neither held nor terminal, so never
more than that many claimed or running (docs/protocol.md, "Groups").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from moonrun.errors import InvalidRequest
from moonrun.scheduling.jobs import Job, JobState, request_cancel
from moonrun.scheduling.time import Instant

MAX_FANOUT: Final = 1000
"""Most servers one fan-out may reach: its jobs are one insert and its answer lists them all."""
MAX_PARALLEL_LIMIT: Final = MAX_FANOUT


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs made by one fan-out, one per matching server."""

    id: str
    creator_id: str
    """The user who made it: they (and platform admins) read and cancel it."""
    selector: str
    """The selector as the creator wrote it."""
    kind: str
    created_at: Instant
    job_count: int
    max_parallel: int | None = None
    """At most this many of its jobs claimed or running at once (None: no limit)."""
    stop_on_failure: bool = False
    """Once one job fails, its queued jobs are cancelled."""
    version: int = 1


def check_options(max_parallel: object, stop_on_failure: object) -> None:
    """Refuse a `max_parallel` outside 1..MAX_PARALLEL_LIMIT or a non-boolean stop flag."""
    if max_parallel is not None and (
        not isinstance(max_parallel, int)
        or isinstance(max_parallel, bool)
        or not 1 <= max_parallel <= MAX_PARALLEL_LIMIT
    ):
        raise InvalidRequest(
            f"max_parallel must be an integer from 1 to {MAX_PARALLEL_LIMIT}",
            fields=(("max_parallel", f"must be from 1 to {MAX_PARALLEL_LIMIT}"),),
        )
    if not isinstance(stop_on_failure, bool):
        raise InvalidRequest("stop_on_failure must be a boolean")


def starts_held(position: int, max_parallel: int | None) -> bool:
    """Whether the group's job at `position` (0-based, in release order) is made held."""
    return max_parallel is not None and position >= max_parallel


def release_order(job: Job) -> tuple[Instant, str]:
    """The order held jobs are released in (the stores' held index order)."""
    return job.created_at, job.id


def to_release(max_parallel: int | None, live: int, held: int) -> int:
    """How many held jobs to release now: enough that `live` (neither held nor terminal) jobs
    reach `max_parallel`, never more than are held."""
    if max_parallel is None:
        return held
    return max(0, min(held, max_parallel - live))


def release(job: Job, now: Instant) -> Job:
    """The held job made claimable (the very record when it is not held or no longer
    waits: releasing twice changes nothing)."""
    if not job.held or job.state is not JobState.QUEUED:
        return job
    return job.unheld(now)


def ended(before: Job | None, after: Job) -> bool:
    """The write ended a job of a group (it became terminal)."""
    return (
        after.group_id is not None
        and after.state.is_terminal
        and (before is None or not before.state.is_terminal)
    )


def stop(job: Job, group_id: str, now: Instant) -> Job:
    """A stopping group's job: cancelled (on the group's behalf) while still queued, else as
    it is."""
    if job.state is not JobState.QUEUED:
        return job
    return request_cancel(job, user_id=group_id, now=now)


def stops(group: Group, ended_jobs: Iterable[Job]) -> bool:
    """A stop-on-failure group stops once one of its jobs ended failed."""
    return group.stop_on_failure and any(job.state is JobState.FAILED for job in ended_jobs)


def is_done(counts: Mapping[JobState, int]) -> bool:
    """Every job of the group is terminal."""
    return all(state.is_terminal for state, n in counts.items() if n)
