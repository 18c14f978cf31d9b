"""Fan-out groups' use cases: make one job per matching server at once, read, wait, cancel.

What a group decides (which jobs start held, how many to release, when it stops) is pure
(`scheduling/groups.py`). `max_parallel` is kept by holding jobs: the jobs past the limit
are made held, and whenever jobs of the group end the service releases as many as the limit
allows, in one store write serialised per group (`Store.release_held`), right after the write
that ended them. A release lost to a crash is made by the sweeper (`repair`), which walks the
groups with held jobs; releasing is idempotent, so a release made twice changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moonrun.clock import Clock
from moonrun.errors import (
    AlreadyExists,
    IdempotencyConflict,
    InvalidRequest,
    MoonrunError,
    NoMatch,
    NotFound,
)
from moonrun.scheduling import concurrency
from moonrun.scheduling import groups as domain
from moonrun.scheduling.fingerprint import canonical_json
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import User
from moonrun.scheduling.retry import check_int
from moonrun.scheduling.selectors import parse_selector
from moonrun.security.access import require
from moonrun.security.tokens import TokenSource
from moonrun.service import checks
from moonrun.service.directory import servers_matching
from moonrun.service.specs import JobSpec
from moonrun.service.waiting import GROUP, Waiting
from moonrun.store.protocol import IdempotencyRecord, Store

if TYPE_CHECKING:
    from moonrun.service.scheduling import SchedulingService

log = logging.getLogger("moonrun.groups")

REPAIR_BATCH = 20
"""Groups with held jobs the sweeper looks at in one pass (it walks them all in turn)."""


MAX_GROUPS_LISTED = 200
"""The most groups one listing of a person's own gives (as a page of jobs)."""


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group and how many of its jobs are in each state."""

    group: Group
    counts: dict[JobState, int]

    @property
    def done(self) -> bool:
        return domain.is_done(self.counts)


@dataclass(frozen=True, slots=True)
class FanOut:
    """What a fan-out made: its group and its jobs (in release order)."""

    group: Group
    jobs: list[Job]


class Groups:
    """Fan-out groups, kept in the store; their jobs are made and cancelled through `jobs`."""

    def __init__(
        self, store: Store, clock: Clock, tokens: TokenSource, jobs: SchedulingService
    ) -> None:
        self._store, self._clock, self._tokens, self._jobs = store, clock, tokens, jobs
        self._repaired_after: str | None = None
        """The last group the sweeper's repair looked at (it goes on after it)."""

    # -- users ----------------------------------------------------------------------------

    def fanout(
        self,
        actor: User,
        selector: str,
        spec: JobSpec,
        *,
        max_parallel: int | None = None,
        stop_on_failure: bool = False,
        idempotency_key: str | None = None,
    ) -> FanOut:
        """One job on each server the actor may submit to whose labels match `selector`, all
        made in one write as one group; `NoMatch` when there is none.

        With an `idempotency_key`, the same key and the same request give the same group
        again (whatever servers match by then); a different request is `IdempotencyConflict`.
        """
        domain.check_options(max_parallel, stop_on_failure)
        concurrency.check(spec.concurrency)
        if not isinstance(selector, str) or not parse_selector(selector).requirements:
            raise InvalidRequest(
                "selector must name at least one label requirement",
                fields=(("selector", "must name at least one label requirement"),),
            )
        record = None
        now = self._clock.now()
        group_id = self._tokens.identifier("grp_")
        if idempotency_key is not None:
            checks.check_pattern("Idempotency-Key", idempotency_key, checks.IDEMPOTENCY_KEY_PATTERN)
            request = {
                "fanout": {
                    **spec.request(""),
                    "selector": selector,
                    "max_parallel": max_parallel,
                    "stop_on_failure": stop_on_failure,
                }
            }
            fingerprint = hashlib.sha256(
                canonical_json(request, field="request", limit=1 << 20)
            ).hexdigest()
            # A fan-out's key records its group, whose jobs are read through it.
            record = IdempotencyRecord(actor.id, idempotency_key, fingerprint, (group_id,), now)
            taken = self._store.idempotency_record(actor.id, idempotency_key)
            if taken is not None:
                return self._again(taken, record)
        servers = servers_matching(self._store, actor, selector)
        if not servers:
            raise NoMatch("no server you may submit to matches the selector")
        if len(servers) > domain.MAX_FANOUT:
            raise InvalidRequest(
                f"the selector matches {len(servers)} servers; a fan-out reaches at most "
                f"{domain.MAX_FANOUT}",
                fields=(("selector", f"matches more than {domain.MAX_FANOUT} servers"),),
            )
        job_ids = sorted(self._tokens.identifier("job_") for _ in servers)
        jobs = self._jobs.group_jobs(servers, spec, group_id, job_ids, max_parallel, now)
        group = Group(
            id=group_id,
            creator_id=actor.id,
            selector=selector,
            kind=spec.kind,
            created_at=now,
            job_count=len(jobs),
            max_parallel=max_parallel,
            stop_on_failure=stop_on_failure,
        )
        try:
            self._store.insert_jobs(jobs, record, group)
        except AlreadyExists:
            taken = None if record is None else self._store.idempotency_record(actor.id, record.key)
            if record is None or taken is None:
                raise
            return self._again(taken, record)
        for job in jobs:
            self._jobs.job_written(job, None)
        return FanOut(group, self._jobs.keys_declared(jobs))

    def _again(self, taken: IdempotencyRecord, record: IdempotencyRecord) -> FanOut:
        """The fan-out an Idempotency-Key was taken for, when the request is the same."""
        if taken.fingerprint != record.fingerprint or len(taken.job_ids) != 1:
            raise IdempotencyConflict()
        group = self._store.get_group(taken.job_ids[0])
        if group is None:
            raise IdempotencyConflict()
        return FanOut(group, self._jobs_of(group))

    def _jobs_of(self, group: Group) -> list[Job]:
        jobs = self._store.list_jobs(
            server_ids=None, state=None, limit=group.job_count, group_id=group.id
        )
        return sorted(jobs, key=domain.release_order)

    def get(self, actor: User, group_id: str) -> GroupState:
        """A group the actor made (any group, for platform admins), with its counts."""
        group = self.accessible(actor, group_id)
        return GroupState(group, self._store.group_counts(group.id))

    def mine(self, actor: User, limit: int = 50) -> list[GroupState]:
        """The newest `limit` groups the actor made, newest first, each with its counts."""
        check_int("limit", limit, 1, MAX_GROUPS_LISTED)
        return [
            GroupState(group, self._store.group_counts(group.id))
            for group in self._store.groups_of(actor.id, limit)
        ]

    def accessible(self, actor: User, group_id: str) -> Group:
        """The group, if the actor may see it: 404 `not_found`, 403 `forbidden`."""
        group = self._store.get_group(group_id) if isinstance(group_id, str) else None
        if group is None:
            raise NotFound("no such group")
        require(actor.platform_admin or actor.id == group.creator_id)
        return group

    async def wait(
        self,
        actor: Callable[[], User],
        group_id: str,
        until: Callable[[GroupState], bool],
        *,
        wait_s: float,
        waiting: Waiting,
    ) -> GroupState:
        """`get` as `actor()` (asked again at every read), once `until` holds of the group, or
        as it is when `wait_s` passes or the client leaves; bounded like a job's read."""
        deadline = time.monotonic() + wait_s

        def read() -> tuple[User, GroupState]:
            user = actor()
            return user, self.get(user, group_id)

        user, state = await waiting.run(read)
        if until(state) or wait_s <= 0:
            return state
        watch = self._jobs.waiters
        _, state = await watch.wait_until(
            read,
            lambda read: until(read[1]),
            on=(GROUP, group_id),
            rooms=watch.read_rooms(user.id, waiting.address),
            deadline=deadline,
            waiting=waiting,
        )
        return state

    def cancel(self, actor: User, group_id: str) -> GroupState:
        """Ask every job of the group that has not ended to cancel (as the actor: a job the
        actor may no longer manage is left alone); waiting ones end at once."""
        group = self.accessible(actor, group_id)
        live = [job.id for job in self._jobs_of(group) if not job.state.is_terminal]
        for start in range(0, len(live), 1000):
            self._jobs.cancel_jobs(actor, live[start : start + 1000])
        return GroupState(group, self._store.group_counts(group.id))

    # -- what follows jobs' ends ------------------------------------------------------------

    def jobs_ended(self, ended: Iterable[Job]) -> None:
        """Jobs of groups ended (their write is committed): stop a stop-on-failure group one
        of them failed in, and release what their places allow. A failure here is logged and
        left to the sweeper (the write that ended them stands)."""
        by_group: dict[str, list[Job]] = defaultdict(list)
        for job in ended:
            if job.group_id is not None:
                by_group[job.group_id].append(job)
        for group_id, jobs in by_group.items():
            try:
                group = self._store.get_group(group_id)
                if group is None:
                    continue
                if domain.stops(group, jobs):
                    self._stop(group)
                if group.max_parallel is not None:
                    self._release(group)
            except MoonrunError as error:
                log.warning("group %s: left to the sweeper: %s", group_id, error.message)

    def _stop(self, group: Group) -> None:
        """Cancel the group's queued jobs (held ones too); those already running finish."""
        queued = self._store.list_jobs(
            server_ids=None, state=JobState.QUEUED, limit=group.job_count, group_id=group.id
        )
        if queued:
            self._jobs.stop_jobs([job.id for job in queued], group.id)

    def _release(self, group: Group) -> int:
        """Release as many held jobs as `max_parallel` allows now; how many it released."""
        now = self._clock.now()
        done = self._store.release_held(
            group.id,
            functools.partial(domain.to_release, group.max_parallel),
            lambda job: domain.release(job, now),
        )
        released = 0
        for before, after in done.values():
            if after is not before:
                released += 1
                self._jobs.job_written(after, before)
        # Released jobs with a key wait on their key now.
        self._jobs.keys.follow(done.values())
        return released

    def repair(self, limit: int = REPAIR_BATCH) -> int:
        """Release what lost writes left held, in a few groups with held jobs (the next few
        at every call, round and round); how many jobs it released."""
        found = self._store.held_groups(self._repaired_after, limit)
        self._repaired_after = found[-1] if len(found) == limit else None
        released = 0
        for group_id in found:
            group = self._store.get_group(group_id)
            if group is not None:
                if group.stop_on_failure and self._store.group_counts(group_id).get(
                    JobState.FAILED
                ):
                    self._stop(group)
                released += self._release(group)
        return released
