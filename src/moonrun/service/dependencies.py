"""Dependencies' use cases: check what a new job names, and settle the jobs waiting on jobs
that ended.

What becomes of a waiting job is pure (`scheduling/dependencies.py`'s `settle`). A job with
dependencies is made held; right after every write that ends jobs (and right after a waiting
job is made) the service finds the jobs waiting on them (`Store.waiters`) and settles each in
one store write (`update_jobs`): released once everything it names succeeded, cancelled with
`dependency_failed` once one of them did not. A job that ended so may have waiters of its own:
they are settled in turn. A settle lost to a crash is made by the sweeper (`repair`), which
walks the jobs still held on their dependencies, a few at every pass; settling is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from moonrun.clock import Clock
from moonrun.errors import InvalidRequest, MoonrunError
from moonrun.scheduling import dependencies as domain
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import User
from moonrun.store.protocol import Store

log = logging.getLogger("moonrun.dependencies")

REPAIR_BATCH: Final = 50
"""Jobs held on their dependencies the sweeper looks at in one pass (it walks them all in
turn)."""

CHUNK: Final = 500
"""Waiting jobs settled in one store write."""


class Dependencies:
    """Jobs that wait on other jobs and groups, kept in the store."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        refused: Callable[[User, Sequence[str]], dict[str, MoonrunError]],
        group_visible: Callable[[User, str], object],
        written: Callable[[Job, Job | None], None],
    ) -> None:
        self._store, self._clock = store, clock
        self._refused, self._group_visible, self._written = refused, group_visible, written
        self._repaired_after: str | None = None
        """The last job the sweeper's repair looked at (it goes on after it)."""

    def check(
        self, actor: User, after: object, after_group: object
    ) -> tuple[tuple[str, ...], str | None]:
        """What a new job of the actor may wait on: jobs and a group they may see. Anything
        else is 422 naming the field; another owner's job reads exactly as a missing one."""
        named, group = domain.check_after(after, after_group)
        refused = self._refused(actor, named) if named else {}
        for index, job_id in enumerate(named):
            if job_id in refused:
                raise InvalidRequest(
                    f"after[{index}]: no such job", fields=((f"after[{index}]", "no such job"),)
                )
        if group is not None:
            try:
                self._group_visible(actor, group)
            except MoonrunError:
                raise InvalidRequest(
                    "after_group: no such group", fields=(("after_group", "no such group"),)
                ) from None
        return named, group

    def jobs_ended(self, ended: Iterable[Job]) -> list[tuple[Job, Job]]:
        """Settle the jobs waiting on `ended` (jobs whose ending write is committed) or on
        their groups; answers (before, after) of every waiting job this changed. A failure is
        logged and left to the sweeper (the write that ended them stands)."""
        on_ids: dict[str, None] = {}
        for job in ended:
            on_ids[job.id] = None
            if job.group_id is not None:
                on_ids[job.group_id] = None
        if not on_ids:
            return []
        try:
            return self.settle(self._store.waiters(list(on_ids)))
        except MoonrunError as error:
            log.warning("dependencies: left to the sweeper: %s", error.message)
            return []

    def settle(self, job_ids: Sequence[str]) -> list[tuple[Job, Job]]:
        """Release or cancel those of the jobs still waiting whose dependencies allow it, a
        chunk per write; (before, after) of each job changed."""
        changed: list[tuple[Job, Job]] = []
        ids = list(dict.fromkeys(job_ids))
        for start in range(0, len(ids), CHUNK):
            found = self._store.get_jobs(ids[start : start + CHUNK])
            changed += self._settle([job for job in found.values() if domain.waits(job)])
        return changed

    def _settle(self, waiting: Sequence[Job]) -> list[tuple[Job, Job]]:
        if not waiting:
            return []
        named = self._store.get_jobs({i for job in waiting for i in job.after})
        states = {job_id: job.state for job_id, job in named.items()}
        counts: dict[str, dict[JobState, int]] = {
            group: self._store.group_counts(group)
            for group in {job.after_group for job in waiting if job.after_group is not None}
        }
        now = self._clock.now()

        def change(job: Job) -> Job:
            group = None if job.after_group is None else counts[job.after_group]
            return domain.settle(job, states, group, now)

        done = self._store.update_jobs([job.id for job in waiting], change)
        changed = [(before, after) for before, after in done.values() if after is not before]
        for before, after in changed:
            self._written(after, before)
        return changed

    def awaited(self, jobs: Iterable[Job]) -> frozenset[str]:
        """Of these jobs and their groups, the ids some job still held on its dependencies
        waits on (retention keeps those: `scheduling/retention.py`'s `still_needed`)."""
        on_ids: dict[str, None] = {}
        for job in jobs:
            on_ids[job.id] = None
            if job.group_id is not None:
                on_ids[job.group_id] = None
        if not on_ids:
            return frozenset()
        waiting = [
            job
            for job in self._store.get_jobs(self._store.waiters(list(on_ids))).values()
            if domain.waits(job)
        ]
        return frozenset(i for job in waiting for i in job.waits_on if i in on_ids)

    def repair(self, limit: int = REPAIR_BATCH) -> list[tuple[Job, Job]]:
        """Settle what lost writes left waiting, a few jobs held on their dependencies at every
        call (the next few each time, round and round); (before, after) of each it changed."""
        found = self._store.dependency_held_jobs(self._repaired_after, limit)
        self._repaired_after = found[-1].id if len(found) == limit else None
        return self._settle(found)
