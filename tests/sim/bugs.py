"""Bugs planted on purpose, to prove the checker catches what it says it catches.

Each is a wrapper around the real store or a subclass of the real service, so the rest of the
platform is unchanged: `MOONRUN_SIM_BUG=<name>` plants one in a replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moonrun.errors import MoonrunError, NotFound
from moonrun.scheduling import messages
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import Job, JobState, RunResult
from moonrun.scheduling.messages import Decision, Evidence, ResultAnswer
from moonrun.scheduling.records import User
from moonrun.service.dependencies import Dependencies
from moonrun.service.scheduling import SchedulingService
from moonrun.store.protocol import ScheduleWrite, Store


class _Wrapper:
    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class GrantsActiveJobs(_Wrapper):
    """A claim that ignores the lease: every third claim also grants one of the endpoint's
    active jobs again, as if it were waiting."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.claims = 0

    def claim_jobs(
        self,
        endpoint_id: str,
        now: int,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        claimed = self._inner.claim_jobs(endpoint_id, now, limit, grant, after_owner)
        self.claims += 1
        if self.claims % 3 or len(claimed) >= limit:
            return claimed
        taken = {job.id for job in claimed}
        victims = sorted(
            (
                job
                for job in self._inner.active_jobs(endpoint_id)
                if job.id not in taken
                and job.cancel is None
                and job.attempt < job.policy.max_attempts
                and (job.deadline_at or 0) > now
            ),
            key=lambda job: job.id,
        )
        if not victims:
            return claimed

        def regrant(job: Job) -> Job:
            waiting = replace(job, state=JobState.RETRYING, eligible_at=now)
            return grant(waiting)

        done = self._inner.update_jobs([victims[0].id], regrant)
        return [*claimed, done[victims[0].id][1]]


class LosesWrites(_Wrapper):
    """A lost commit: every seventh job update that changes something answers as committed
    but is never written."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.updates = 0

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        stored = self._inner.get_jobs(job_ids)
        changes = {job_id: change(job) for job_id, job in stored.items()}
        if any(after is not stored[job_id] for job_id, after in changes.items()):
            self.updates += 1
            if self.updates % 7 == 0:
                return {job_id: (stored[job_id], after) for job_id, after in changes.items()}

        def same(job: Job) -> Job:
            after = changes[job.id]
            return job if after is stored[job.id] else after

        return self._inner.update_jobs(job_ids, same)


class AcceptsStaleResults(SchedulingService):
    """A result accepted from a stale attempt: the result's evidence is believed for the
    attempt it names, without comparing that attempt with the job's current one."""

    def result_many(
        self, session_id: str, results: Sequence[tuple[str, Evidence, Mapping[str, Any]]]
    ) -> list[ResultAnswer | MoonrunError]:
        caller = self._caller(session_id)
        reported = {
            job_id: (
                evidence,
                RunResult.of(f["outcome"], f["retryable"], f.get("error"), f.get("output")),
            )
            for job_id, evidence, f in results
        }

        def decide(job: Job, now: int, draw: float) -> Decision[ResultAnswer]:
            evidence, result = reported[job.id]
            if evidence.attempt < job.attempt and job.state is JobState.RUNNING:
                named = replace(
                    job,
                    attempt=evidence.attempt,
                    lease_hash=token_hash(evidence.lease),
                    session_generation=caller.generation,
                    last_failure=None,
                )
                decision = messages.result(named, caller, evidence, result, now=now, draw=draw)
                if decision.error is None:
                    ended = replace(decision.job, attempt=job.attempt, lease_hash=job.lease_hash)
                    return Decision(ended, decision.answer)
            return messages.result(job, caller, evidence, result, now=now, draw=draw)

        return self._apply_many(list(reported), decide)


class DropsFirings(_Wrapper):
    """A firing pass that moves a schedule's cursor but makes no job, every other time."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.firings = 0

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        kept = []
        for write in writes:
            if write.job is not None or write.group is not None:
                self.firings += 1
                if self.firings % 2 == 0:
                    write = replace(write, job=None, group=None, group_jobs=())
            kept.append(write)
        return self._inner.fire_schedules(kept)


class FiresTwice(_Wrapper):
    """A firing whose job id is not derived from its schedule and time: the same time's job
    is made again under another id."""

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        stored = self._inner.fire_schedules(writes)
        for write, won in zip(writes, stored, strict=True):
            if won and write.job is not None:
                self._inner.insert_jobs([replace(write.job, id=write.job.id + "x")])
            if won and write.group_jobs:  # a selector firing's jobs, made again
                self._inner.insert_jobs([replace(job, id=job.id + "x") for job in write.group_jobs])
        return stored


class ReleasesEveryHeldJob(_Wrapper):
    """A release that forgets max_parallel: whenever a job of a group ends, every held job
    of the group becomes claimable."""

    def release_held(
        self,
        group_id: str,
        how_many: Callable[[int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        return self._inner.release_held(group_id, lambda live, held: held, release)


class ReleasesEveryKeyedJob(_Wrapper):
    """A release that forgets a key's limit: every held job of the key becomes claimable."""

    def release_key(
        self,
        owner_id: str,
        key: str,
        limit: int,
        declare: bool,
        how_many: Callable[[int, int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        return self._inner.release_key(
            owner_id, key, limit, declare, lambda _, __, held: held, release
        )


class ForgetsDependencies(_Wrapper):
    """A create that forgets to hold a job waiting on others: it is claimable at once."""

    def insert_jobs(self, jobs: Sequence[Job], *args: Any) -> None:
        self._inner.insert_jobs(
            [replace(job, held=False) if job.after else job for job in jobs], *args
        )


class PrunesUnfinishedGroups(SchedulingService):
    """Retention that forgets a fan-out's unfinished jobs: a finished job of a group is
    pruned (or deleted) although others of its group have not ended."""

    def _unfinished_groups(self, jobs: Iterable[Job]) -> frozenset[str]:
        return frozenset()


class _AwaitsNothing:
    def __init__(self, inner: Dependencies) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def awaited(self, jobs: Iterable[Job]) -> frozenset[str]:
        return frozenset()


class PrunesAwaitedJobs(SchedulingService):
    """Retention that forgets dependencies: a finished job is pruned although a job still held
    on its dependencies waits on it."""

    def prune(self, forget: Callable[[Job], None], limit: int | None = None) -> list[Job]:
        dependencies = self.dependencies
        self.dependencies = _AwaitsNothing(dependencies)  # type: ignore[assignment]
        try:
            return super().prune(forget, limit)
        finally:
            self.dependencies = dependencies


class DeletesUnfinishedJobs(SchedulingService):
    """A user's delete that forgets to ask whether the job may go: it deletes a job that has
    not ended."""

    def delete_job(self, actor: User, job_id: str, forget: Callable[[Job], None]) -> Job:
        job = self._store.get_job(job_id)
        if job is None:
            raise NotFound("no such job")
        forget(job)
        self._store.delete_jobs([job_id], lambda stored: True)
        return job


class PrunesEarly(SchedulingService):
    """Retention that reads its window in the wrong unit: a finished job is pruned a second
    after it ended, whatever `retain_finished_s` says."""

    def prune(self, forget: Callable[[Job], None], limit: int | None = None) -> list[Job]:
        settings = self._settings
        self._settings = replace(settings, retain_finished_s=settings.retain_finished_s / 1000)
        try:
            return super().prune(forget, limit)
        finally:
            self._settings = settings


class ForgetsPriorities(_Wrapper):
    """A store that keeps every job at the default priority, whatever its create asked."""

    def insert_jobs(self, jobs: Sequence[Job], *args: Any) -> None:
        self._inner.insert_jobs([replace(job, priority=5) for job in jobs], *args)


@dataclass(frozen=True)
class Bug:
    name: str
    rule: str
    """The checker rule that must report it."""
    wrap_store: Callable[[Store], Store] | None = None
    service_class: type[SchedulingService] | None = None


BUGS = {
    bug.name: bug
    for bug in (
        Bug("double_grant", "lease_overlap", wrap_store=GrantsActiveJobs),  # type: ignore[arg-type]
        Bug("stale_result", "stale_result", service_class=AcceptsStaleResults),
        Bug("lost_commit", "lost_commit", wrap_store=LosesWrites),  # type: ignore[arg-type]
        Bug("dropped_firing", "schedule_not_fired", wrap_store=DropsFirings),  # type: ignore[arg-type]
        Bug("double_firing", "schedule_twice", wrap_store=FiresTwice),  # type: ignore[arg-type]
        Bug("release_all", "group_parallel", wrap_store=ReleasesEveryHeldJob),  # type: ignore[arg-type]
        Bug("key_release_all", "key_limit", wrap_store=ReleasesEveryKeyedJob),  # type: ignore[arg-type]
        Bug("no_wait", "dependency_order", wrap_store=ForgetsDependencies),  # type: ignore[arg-type]
        Bug("no_priority", "priority_order", wrap_store=ForgetsPriorities),  # type: ignore[arg-type]
        Bug("prune_group", "pruned_needed", service_class=PrunesUnfinishedGroups),
        Bug("prune_awaited", "pruned_needed", service_class=PrunesAwaitedJobs),
        Bug("delete_unfinished", "pruned_needed", service_class=DeletesUnfinishedJobs),
        Bug("prune_early", "pruned_early", service_class=PrunesEarly),
    )
}
