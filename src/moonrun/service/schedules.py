"""Schedules' use cases: create, read, change, pause, trigger, and fire what is due.

What fires when is decided in `scheduling/schedules.py`; here each decision is applied with
one compare-and-swap of the schedule that also inserts the firing's job (`fire_schedules`), so
two platforms deciding the same time, or one deciding it again after a crash, make one job. A
selector schedule's firing is a fan-out group instead (one job per server its creator may
submit to whose labels match at the firing time), inserted in that same write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moonrun.clock import Clock
from moonrun.errors import InvalidRequest, MoonrunError, NotFound
from moonrun.scheduling import concurrency as concurrency_domain
from moonrun.scheduling import cron as cron_domain
from moonrun.scheduling import groups as groups_domain
from moonrun.scheduling import schedules as domain
from moonrun.scheduling.fingerprint import JsonValue
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.records import Server, User
from moonrun.scheduling.schedules import Overlap, Schedule
from moonrun.scheduling.selectors import parse_selector
from moonrun.scheduling.time import Instant
from moonrun.security.access import require
from moonrun.security.tokens import TokenSource
from moonrun.service.directory import servers_matching
from moonrun.service.specs import JobSpec
from moonrun.store.protocol import ScheduleWrite, Store

if TYPE_CHECKING:
    from moonrun.service.scheduling import SchedulingService

log = logging.getLogger("moonrun.schedules")

FIRE_BATCH = 100
"""Schedules decided in one pass; a full batch is followed at once by another."""
CAS_TRIES = 8


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a user asks for when creating a schedule (or all of it, for a change)."""

    name: str
    cron: str
    job: JobSpec
    timezone: str = "UTC"
    overlap: str = Overlap.SKIP.value
    catchup_window_s: int = domain.DEFAULT_CATCHUP_WINDOW_S
    paused: bool = False
    selector: str | None = None
    """A label selector in place of a server: each firing is a group (docs/protocol.md,
    "Schedules")."""
    max_parallel: int | None = None
    """A selector schedule's groups' `max_parallel`."""
    stop_on_failure: bool = False
    """A selector schedule's groups' `stop_on_failure`."""


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule with what its view needs beside it: its last firing's job (or group), and
    whether its owner may have jobs made now."""

    schedule: Schedule
    last_job: Job | None
    owner_disabled: bool
    next_times: tuple[Instant, ...]
    last_group_done: bool | None = None
    """Whether every job of the last firing's group has ended (None: no group, or gone)."""


@dataclass(frozen=True, slots=True)
class Triggered:
    """What a trigger made: the job (a server's schedule) or the group (a selector
    schedule's), or neither (the overlap policy skipped it, or nothing matched)."""

    state: ScheduleState
    job_id: str | None
    group_id: str | None = None


class Schedules:
    """Recurring jobs of servers, kept in the store and fired by `fire_due`."""

    def __init__(
        self, store: Store, clock: Clock, tokens: TokenSource, jobs: SchedulingService
    ) -> None:
        self._store, self._clock, self._tokens, self._jobs = store, clock, tokens, jobs
        self.fired = 0
        """Jobs made by firings in this process (for `/metrics`)."""

    # -- users ----------------------------------------------------------------------------

    def create(self, actor: User, server_id: str | None, spec: ScheduleSpec) -> ScheduleState:
        """A schedule of a server whose jobs the actor manages, or (`server_id` None, a
        `spec.selector`) of the servers the actor may submit to whose labels match the
        selector at each firing: exactly one of the two."""
        if (server_id is None) == (spec.selector is None):
            raise InvalidRequest(
                "a schedule names exactly one of server_id and selector",
                fields=(("selector", "give exactly one of server_id and selector"),),
            )
        now = self._clock.now()
        expression, where = _calendar(spec.cron, spec.timezone)
        if server_id is not None:
            if spec.max_parallel is not None or spec.stop_on_failure:
                raise InvalidRequest(
                    "max_parallel and stop_on_failure are a selector schedule's (its groups')"
                )
            server = self._jobs.manageable_server(actor, server_id)
            owner_id, job_json = server.owner_id, self._job_json(server_id, spec.job, actor)
            group: dict[str, Any] = {}
        else:
            groups_domain.check_options(spec.max_parallel, spec.stop_on_failure)
            selector = _selector(spec.selector)
            owner_id, job_json = actor.id, self._fanout_job_json(actor, selector, spec.job)
            group = {
                "selector": selector,
                "max_parallel": spec.max_parallel,
                "stop_on_failure": spec.stop_on_failure,
            }
        schedule = Schedule(
            id=self._tokens.identifier("sch_"),
            server_id=server_id,
            owner_id=owner_id,
            name=_name(spec.name),
            cron=spec.cron.strip(),
            timezone=spec.timezone,
            job_json=job_json,
            overlap=_overlap(spec.overlap),
            catchup_window_s=_window(spec.catchup_window_s),
            paused=spec.paused,
            created_at=now,
            next_at=domain.first_cursor(expression, where, now),
            **group,
        )
        self._store.insert_schedule(schedule)
        return self._state(schedule, now)

    def list_schedules(self, actor: User, server_id: str | None = None) -> list[ScheduleState]:
        """The schedules of the servers whose jobs the actor manages (or of one of them), and
        the selector schedules the actor made (every one, for platform admins)."""
        if server_id is not None:
            self._jobs.manageable_server(actor, server_id)
            found = self._store.list_schedules(server_id)
        elif actor.platform_admin:
            found = self._store.list_schedules()
        else:
            found = [
                schedule
                for server in self._store.servers_of_user(actor.id)
                for schedule in self._store.list_schedules(server.id)
            ]
            found += self._store.selector_schedules(actor.id)
        now = self._clock.now()
        return [self._state(schedule, now) for schedule in found]

    def selector_schedules(self, actor: User) -> list[ScheduleState]:
        """The selector schedules the actor made (every one, for platform admins)."""
        if actor.platform_admin:
            found = [s for s in self._store.list_schedules() if s.fans_out]
        else:
            found = self._store.selector_schedules(actor.id)
        now = self._clock.now()
        return [self._state(schedule, now) for schedule in found]

    def get(self, actor: User, schedule_id: str) -> ScheduleState:
        return self._state(self._accessible(actor, schedule_id), self._clock.now())

    def change(self, actor: User, schedule_id: str, changes: Mapping[str, Any]) -> ScheduleState:
        """Apply a partial change (`name`, `cron`, `timezone`, `job`, `overlap`,
        `catchup_window_s`, `paused`; a selector schedule's `selector`, `max_parallel` and
        `stop_on_failure` too); a new calendar starts after now."""

        def changed(schedule: Schedule, now: Instant) -> Schedule:
            updates: dict[str, Any] = {}
            grouping = {"selector", "max_parallel", "stop_on_failure"} & set(changes)
            if grouping and not schedule.fans_out:
                raise InvalidRequest(
                    f"{sorted(grouping)[0]}: this schedule names a server, not a selector",
                    fields=((sorted(grouping)[0], "only a selector schedule has one"),),
                )
            if grouping:
                groups_domain.check_options(
                    changes.get("max_parallel", schedule.max_parallel),
                    changes.get("stop_on_failure", schedule.stop_on_failure),
                )
                if "selector" in changes:
                    updates["selector"] = _selector(changes["selector"])
                if "max_parallel" in changes:
                    updates["max_parallel"] = changes["max_parallel"]
                if "stop_on_failure" in changes:
                    updates["stop_on_failure"] = changes["stop_on_failure"]
            if "name" in changes:
                updates["name"] = _name(changes["name"])
            if "overlap" in changes:
                updates["overlap"] = _overlap(changes["overlap"])
            if "catchup_window_s" in changes:
                updates["catchup_window_s"] = _window(changes["catchup_window_s"])
            if "paused" in changes:
                updates["paused"] = bool(changes["paused"])
            if "job" in changes or "selector" in changes:
                job: JobSpec = changes["job"] if "job" in changes else _spec(schedule.job_json)
                if schedule.server_id is not None:
                    updates["job_json"] = self._job_json(schedule.server_id, job, actor)
                else:
                    # Checked on the servers the selector reaches now, as its creator.
                    creator = self._store.get_user(schedule.owner_id) or actor
                    selector = _selector(updates.get("selector", schedule.selector))
                    updates["job_json"] = self._fanout_job_json(creator, selector, job)
            if "cron" in changes or "timezone" in changes:
                text = changes.get("cron", schedule.cron)
                zone_name = changes.get("timezone", schedule.timezone)
                expression, where = _calendar(text, zone_name)
                updates |= {
                    "cron": text.strip(),
                    "timezone": zone_name,
                    "next_at": domain.first_cursor(expression, where, now),
                }
            return dataclasses.replace(schedule, **updates, version=schedule.version + 1)

        return self._update(actor, schedule_id, changed)

    def pause(self, actor: User, schedule_id: str) -> ScheduleState:
        return self.change(actor, schedule_id, {"paused": True})

    def resume(self, actor: User, schedule_id: str) -> ScheduleState:
        """Fire again; the times missed while paused are decided at once (at most one
        catch-up firing, within the window)."""
        return self.change(actor, schedule_id, {"paused": False})

    def delete(self, actor: User, schedule_id: str) -> ScheduleState:
        """Delete it; the answer is the schedule as it was. Its jobs stay."""
        state = self.get(actor, schedule_id)
        if not self._store.delete_schedule(schedule_id):
            raise NotFound("no such schedule")
        return state

    def trigger(self, actor: User, schedule_id: str) -> Triggered:
        """Fire now, outside the calendar, under the overlap policy: the schedule and the job
        (or group) made (None when the policy skipped it, or nothing matched)."""
        for _ in range(CAS_TRIES):
            schedule = self._accessible(actor, schedule_id)
            now = self._clock.now()
            bumped = dataclasses.replace(schedule, version=schedule.version + 1)
            firing = domain.fire(bumped, now, self._previous_running(schedule))
            write = self._write_for(schedule, firing)
            if self._store_writes([write])[0]:
                return Triggered(
                    self._state(write.schedule, now),
                    None if write.job is None else write.job.id,
                    None if write.group is None else write.group.id,
                )
        raise MoonrunError("the schedule kept changing; try again")

    def preview(self, cron: object, timezone: object) -> list[Instant]:
        """The next 5 times a calendar would fire from now (a form's preview), or the
        InvalidRequest a create would answer."""
        expression, where = _calendar(cron, timezone)
        return expression.times_after(self._clock.now(), where, domain.NEXT_TIMES)

    # -- the firing loop -----------------------------------------------------------------------

    def fire_due(self, limit: int = FIRE_BATCH) -> int:
        """Decide every schedule whose cursor has passed, up to `limit`, and store the
        decisions in one write (one commit for the whole pass); returns how many were due."""
        now = self._clock.now()
        due = self._store.due_schedules(now, limit)
        if not due:
            return 0
        last_ids = [s.last_job_id for s in due if s.last_job_id is not None]
        last_jobs = self._store.get_jobs(last_ids) if last_ids else {}
        last_groups = {
            s.last_group_id: self._group_running(s.last_group_id)
            for s in due
            if s.last_group_id is not None
        }
        owners: dict[str, bool] = {}
        writes: list[ScheduleWrite] = []
        for schedule in due:
            if schedule.owner_id not in owners:
                owner = self._store.get_user(schedule.owner_id)
                owners[schedule.owner_id] = owner is not None and not owner.disabled
            last = last_jobs.get(schedule.last_job_id or "")
            running = (
                last_groups.get(schedule.last_group_id or "", False)
                if schedule.fans_out
                else last is not None and not last.state.is_terminal
            )
            try:
                firing = domain.decide(
                    schedule,
                    *_calendar(schedule.cron, schedule.timezone),
                    now,
                    previous_running=running,
                    owner_enabled=owners[schedule.owner_id],
                )
                writes.append(self._write_for(schedule, firing))
            except MoonrunError as error:  # one schedule's trouble never stops the others
                if error.code == "store_unavailable":
                    raise
                log.warning(
                    "schedule not decided",
                    extra={"fields": {"schedule_id": schedule.id, "error": error.message}},
                )
        self._store_writes(writes)  # a lost race leaves the other platform's decision
        return len(due)

    def _write_for(self, schedule: Schedule, firing: domain.Firing) -> ScheduleWrite:
        """The store write of a decision: the firing's job built (or, when it cannot be
        made any more, the time counted missed); a previous job to cancel is asked first."""
        if firing.scheduled_for is None:
            return ScheduleWrite(firing.schedule, schedule.version, None)
        if schedule.fans_out:
            return self._group_write_for(schedule, firing, firing.scheduled_for)
        try:
            job = self._build(schedule, firing.scheduled_for)
        except MoonrunError as error:  # the server or its kinds changed since: a miss
            if error.code == "store_unavailable":
                raise
            log.warning(
                "schedule could not fire",
                extra={"fields": {"schedule_id": schedule.id, "error": error.message}},
            )
            return ScheduleWrite(_missed(schedule, firing), schedule.version, None)
        if firing.cancel_previous and schedule.last_job_id is not None:
            self._cancel_previous(schedule)
        return ScheduleWrite(firing.schedule, schedule.version, job)

    def _group_write_for(
        self, schedule: Schedule, firing: domain.Firing, scheduled_for: Instant
    ) -> ScheduleWrite:
        """A selector firing's write: its group and one job per server the creator may submit
        to whose labels match now; nothing matching is recorded (`nothing_matched`), and a
        group that cannot be made (a Run refusing the kind, too many servers) is a miss."""
        try:
            built = self._build_group(schedule, scheduled_for)
        except MoonrunError as error:
            if error.code == "store_unavailable":
                raise
            log.warning(
                "schedule could not fire",
                extra={"fields": {"schedule_id": schedule.id, "error": error.message}},
            )
            return ScheduleWrite(_missed(schedule, firing), schedule.version, None)
        if built is None:
            firing = domain.nothing_matched(firing)
        if firing.cancel_previous and schedule.last_group_id is not None:
            self._cancel_previous_group(schedule)
        if built is None:
            return ScheduleWrite(firing.schedule, schedule.version, None)
        group, jobs = built
        return ScheduleWrite(firing.schedule, schedule.version, group=group, group_jobs=jobs)

    def _build_group(
        self, schedule: Schedule, scheduled_for: Instant
    ) -> tuple[Group, tuple[Job, ...]] | None:
        """The group of a selector firing and its jobs (None: no server matches). Ids derive
        from (schedule, time[, server]); the jobs are in id order, which is their release
        order, so which of them start held is the same on every platform."""
        creator = self._store.get_user(schedule.owner_id)
        if creator is None or schedule.selector is None:
            raise NotFound("the schedule's creator is gone")
        servers = servers_matching(self._store, creator, schedule.selector)
        if not servers:
            return None
        if len(servers) > groups_domain.MAX_FANOUT:
            raise InvalidRequest(
                f"the selector matches {len(servers)} servers; a group reaches at most "
                f"{groups_domain.MAX_FANOUT}"
            )
        placed: list[tuple[str, Server]] = sorted(
            (
                (domain.group_job_id(schedule.id, scheduled_for, server.id), server)
                for server in servers
            ),
            key=lambda pair: pair[0],
        )
        spec = _spec(schedule.job_json)
        group_id = domain.firing_group_id(schedule.id, scheduled_for)
        now = self._clock.now()
        jobs = self._jobs.group_jobs(
            [server for _, server in placed],
            spec,
            group_id,
            [job_id for job_id, _ in placed],
            schedule.max_parallel,
            now,
            schedule_id=schedule.id,
            scheduled_for=scheduled_for,
        )
        group = Group(
            id=group_id,
            creator_id=schedule.owner_id,
            selector=schedule.selector,
            kind=spec.kind,
            created_at=now,
            job_count=len(jobs),
            max_parallel=schedule.max_parallel,
            stop_on_failure=schedule.stop_on_failure,
        )
        return group, tuple(jobs)

    def _store_writes(self, writes: list[ScheduleWrite]) -> list[bool]:
        stored = self._store.fire_schedules(writes) if writes else []
        made = [
            job
            for write, won in zip(writes, stored, strict=True)
            if won
            for job in ((write.job,) if write.job is not None else write.group_jobs)
        ]
        # A job with a concurrency key is made held by it: its key releases it now, as after
        # a create (`keys_declared`), not at the sweeper's repair.
        for job in self._jobs.keys_declared(made):
            self.fired += 1
            self._jobs.job_stored(job)
        return stored

    def _build(self, schedule: Schedule, scheduled_for: Instant) -> Job:
        server = None if schedule.server_id is None else self._store.get_server(schedule.server_id)
        if server is None:
            raise NotFound("the schedule's server was removed")
        return self._jobs.scheduled_job(
            server,
            _spec(schedule.job_json),
            job_id=domain.firing_job_id(schedule.id, scheduled_for),
            schedule_id=schedule.id,
            scheduled_for=scheduled_for,
        )

    def _cancel_previous(self, schedule: Schedule) -> None:
        owner = self._store.get_user(schedule.owner_id)
        if owner is None or schedule.last_job_id is None:
            return
        with contextlib.suppress(NotFound):  # pruned: nothing left to cancel
            self._jobs.cancel_job(owner, schedule.last_job_id)

    def _cancel_previous_group(self, schedule: Schedule) -> None:
        """Ask the previous firing's group's jobs to cancel, as its creator would."""
        creator = self._store.get_user(schedule.owner_id)
        if creator is None or schedule.last_group_id is None:
            return
        with contextlib.suppress(NotFound):
            self._jobs.groups.cancel(creator, schedule.last_group_id)

    # -- helpers -----------------------------------------------------------------------------

    def _previous_running(self, schedule: Schedule) -> bool:
        if schedule.fans_out:
            return schedule.last_group_id is not None and self._group_running(
                schedule.last_group_id
            )
        if schedule.last_job_id is None:
            return False
        job = self._store.get_job(schedule.last_job_id)
        return job is not None and not job.state.is_terminal

    def _accessible(self, actor: User, schedule_id: str) -> Schedule:
        schedule = self._store.get_schedule(schedule_id)
        if schedule is None:
            raise NotFound("no such schedule")
        if schedule.server_id is None:
            # A selector schedule is its creator's, as a fan-out group is.
            require(actor.platform_admin or actor.id == schedule.owner_id)
        else:
            self._jobs.manageable_server(actor, schedule.server_id)
        return schedule

    def _group_running(self, group_id: str) -> bool:
        """The group has a job that has not ended (a group whose jobs are gone has none)."""
        return not groups_domain.is_done(self._store.group_counts(group_id))

    def _update(self, actor: User, schedule_id: str, change: Any) -> ScheduleState:
        for _ in range(CAS_TRIES):
            schedule = self._accessible(actor, schedule_id)
            now = self._clock.now()
            updated = change(schedule, now)
            if self._store.fire_schedules([ScheduleWrite(updated, schedule.version, None)])[0]:
                return self._state(updated, now)
        raise MoonrunError("the schedule kept changing; try again")

    def _job_json(self, server_id: str, spec: JobSpec, actor: User) -> str:
        """The job template as stored, checked now as a create would check it."""
        server = self._jobs.manageable_server(actor, server_id)
        if spec.not_before is not None:
            raise InvalidRequest("job.not_before: a schedule's jobs start at their times")
        self._jobs.scheduled_job(
            server, spec, job_id="job_" + "a" * 16, schedule_id="sch_check", scheduled_for=0
        )
        return _template(spec)

    def _fanout_job_json(self, creator: User, selector: str, spec: JobSpec) -> str:
        """A selector schedule's job template, checked as a fan-out would check it now on the
        servers the selector matches (on none yet: as a create on a server whose Run
        advertised no kinds)."""
        if spec.not_before is not None:
            raise InvalidRequest("job.not_before: a schedule's jobs start at their times")
        servers = servers_matching(self._store, creator, selector)[: groups_domain.MAX_FANOUT]
        now = self._clock.now()
        checked = servers or [Server("srv_check", "check", "ep_check", creator.id, now)]
        self._jobs.group_jobs(
            checked, spec, "grp_check", [f"job_check{n}" for n in range(len(checked))], None, now
        )
        return _template(spec)

    def _state(self, schedule: Schedule, now: Instant) -> ScheduleState:
        owner = self._store.get_user(schedule.owner_id)
        last = None if schedule.last_job_id is None else self._store.get_job(schedule.last_job_id)
        done = None
        if schedule.last_group_id is not None:
            counts = self._store.group_counts(schedule.last_group_id)
            done = groups_domain.is_done(counts) if counts else None
        expression, where = _calendar(schedule.cron, schedule.timezone)
        times = domain.next_times(schedule, expression, where, now)
        return ScheduleState(
            schedule, last, owner is None or owner.disabled, tuple(times), last_group_done=done
        )


def _template(spec: JobSpec) -> str:
    """The job template as stored (options named only when given)."""
    template = {
        "kind": spec.kind,
        "payload": spec.payload,
        "max_attempts": spec.max_attempts,
        "backoff": dict(spec.backoff) if spec.backoff is not None else None,
    }
    # Options named only when given: a template naming none reads as it always did.
    if spec.priority is not None:
        template["priority"] = spec.priority
    concurrency = concurrency_domain.check(spec.concurrency)
    if concurrency is not None:
        template["concurrency"] = {"key": concurrency.key, "limit": concurrency.limit}
    return json.dumps(template, separators=(",", ":"), sort_keys=True)


def job_template(schedule: Schedule) -> dict[str, JsonValue]:
    """The stored job template as a JSON object."""
    template: dict[str, JsonValue] = json.loads(schedule.job_json)
    return template


def _spec(job_json: str) -> JobSpec:
    template = json.loads(job_json)
    return JobSpec(
        kind=template["kind"],
        payload=template.get("payload"),
        max_attempts=template.get("max_attempts"),
        backoff=template.get("backoff"),
        priority=template.get("priority"),
        concurrency=template.get("concurrency"),
    )


def _missed(schedule: Schedule, firing: domain.Firing) -> Schedule:
    """A firing whose job (or group) could not be made: counted missed, the last firing as it
    was."""
    return dataclasses.replace(
        firing.schedule,
        missed=firing.schedule.missed + 1,
        last_scheduled_for=schedule.last_scheduled_for,
        last_job_id=schedule.last_job_id,
        last_group_id=schedule.last_group_id,
    )


def _selector(selector: object) -> str:
    """A selector schedule's selector, checked as a fan-out checks one: it parses (else
    `invalid_selector` with the position) and names at least one requirement."""
    if not isinstance(selector, str) or not parse_selector(selector).requirements:
        raise InvalidRequest(
            "selector must name at least one label requirement",
            fields=(("selector", "must name at least one label requirement"),),
        )
    return selector


def _calendar(text: object, zone_name: object) -> tuple[cron_domain.Calendar, Any]:
    return cron_domain.parse(text), domain.zone(zone_name)


def _name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= domain.NAME_MAX
        or not name.isprintable()
        or name != name.strip()
    ):
        raise InvalidRequest(
            f"name must be 1 to {domain.NAME_MAX} printable characters, without surrounding spaces"
        )
    return name


def _overlap(value: object) -> Overlap:
    try:
        return Overlap(value if isinstance(value, str) else "")
    except ValueError:
        known = ", ".join(o.value for o in Overlap)
        raise InvalidRequest(f"overlap must be one of {known}") from None


def _window(value: object) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= domain.MAX_CATCHUP_WINDOW_S
    ):
        raise InvalidRequest(
            f"catchup_window_s must be a whole number from 0 to {domain.MAX_CATCHUP_WINDOW_S}"
        )
    return value
