"""Schedules' use cases: create, read, change, pause, trigger, and fire what is due.

What fires when is decided in `scheduling/schedules.py`; here each decision is applied with
one compare-and-swap of the schedule that also inserts the firing's job (`fire_schedules`), so
two platforms deciding the same time, or one deciding it again after a crash, make one job.
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
from moonrun.scheduling import schedules as domain
from moonrun.scheduling.fingerprint import JsonValue
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.records import User
from moonrun.scheduling.schedules import Overlap, Schedule
from moonrun.scheduling.time import Instant
from moonrun.security.tokens import TokenSource
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


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule with what its view needs beside it: its last firing's job, and whether its
    owner may have jobs made now."""

    schedule: Schedule
    last_job: Job | None
    owner_disabled: bool
    next_times: tuple[Instant, ...]


class Schedules:
    """Recurring jobs of servers, kept in the store and fired by `fire_due`."""

    def __init__(
        self, store: Store, clock: Clock, tokens: TokenSource, jobs: SchedulingService
    ) -> None:
        self._store, self._clock, self._tokens, self._jobs = store, clock, tokens, jobs
        self.fired = 0
        """Jobs made by firings in this process (for `/metrics`)."""

    # -- users ----------------------------------------------------------------------------

    def create(self, actor: User, server_id: str, spec: ScheduleSpec) -> ScheduleState:
        server = self._jobs.manageable_server(actor, server_id)
        now = self._clock.now()
        expression, where = _calendar(spec.cron, spec.timezone)
        schedule = Schedule(
            id=self._tokens.identifier("sch_"),
            server_id=server.id,
            owner_id=server.owner_id,
            name=_name(spec.name),
            cron=spec.cron.strip(),
            timezone=spec.timezone,
            job_json=self._job_json(server_id, spec.job, actor),
            overlap=_overlap(spec.overlap),
            catchup_window_s=_window(spec.catchup_window_s),
            paused=spec.paused,
            created_at=now,
            next_at=domain.first_cursor(expression, where, now),
        )
        self._store.insert_schedule(schedule)
        return self._state(schedule, now)

    def list_schedules(self, actor: User, server_id: str | None = None) -> list[ScheduleState]:
        """The schedules of the servers whose jobs the actor manages (or of one of them)."""
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
        now = self._clock.now()
        return [self._state(schedule, now) for schedule in found]

    def get(self, actor: User, schedule_id: str) -> ScheduleState:
        return self._state(self._accessible(actor, schedule_id), self._clock.now())

    def change(self, actor: User, schedule_id: str, changes: Mapping[str, Any]) -> ScheduleState:
        """Apply a partial change (`name`, `cron`, `timezone`, `job`, `overlap`,
        `catchup_window_s`, `paused`); a new calendar starts after now."""

        def changed(schedule: Schedule, now: Instant) -> Schedule:
            updates: dict[str, Any] = {}
            if "name" in changes:
                updates["name"] = _name(changes["name"])
            if "overlap" in changes:
                updates["overlap"] = _overlap(changes["overlap"])
            if "catchup_window_s" in changes:
                updates["catchup_window_s"] = _window(changes["catchup_window_s"])
            if "paused" in changes:
                updates["paused"] = bool(changes["paused"])
            if "job" in changes:
                job: JobSpec = changes["job"]
                updates["job_json"] = self._job_json(schedule.server_id, job, actor)
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

    def trigger(self, actor: User, schedule_id: str) -> tuple[ScheduleState, str | None]:
        """Fire now, outside the calendar, under the overlap policy: the schedule and the job
        made (None when the policy skipped it)."""
        for _ in range(CAS_TRIES):
            schedule = self._accessible(actor, schedule_id)
            now = self._clock.now()
            bumped = dataclasses.replace(schedule, version=schedule.version + 1)
            firing = domain.fire(bumped, now, self._previous_running(schedule))
            stored, job = self._apply(schedule, firing)
            if stored:
                return self._state(firing.schedule, now), (job.id if job is not None else None)
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
        owners: dict[str, bool] = {}
        writes: list[ScheduleWrite] = []
        for schedule in due:
            if schedule.owner_id not in owners:
                owner = self._store.get_user(schedule.owner_id)
                owners[schedule.owner_id] = owner is not None and not owner.disabled
            last = last_jobs.get(schedule.last_job_id or "")
            try:
                firing = domain.decide(
                    schedule,
                    *_calendar(schedule.cron, schedule.timezone),
                    now,
                    previous_running=last is not None and not last.state.is_terminal,
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

    def _apply(self, schedule: Schedule, firing: domain.Firing) -> tuple[bool, Job | None]:
        """Store one decision: whether it was stored (not when the schedule changed
        meanwhile), and the job it made."""
        write = self._write_for(schedule, firing)
        stored = self._store_writes([write])[0]
        return stored, write.job if stored else None

    def _write_for(self, schedule: Schedule, firing: domain.Firing) -> ScheduleWrite:
        """The store write of a decision: the firing's job built (or, when it cannot be
        made any more, the time counted missed); a previous job to cancel is asked first."""
        if firing.scheduled_for is None:
            return ScheduleWrite(firing.schedule, schedule.version, None)
        try:
            job = self._build(schedule, firing.scheduled_for)
        except MoonrunError as error:  # the server or its kinds changed since: a miss
            if error.code == "store_unavailable":
                raise
            log.warning(
                "schedule could not fire",
                extra={"fields": {"schedule_id": schedule.id, "error": error.message}},
            )
            missed = dataclasses.replace(
                firing.schedule,
                missed=firing.schedule.missed + 1,
                last_scheduled_for=schedule.last_scheduled_for,
                last_job_id=schedule.last_job_id,
            )
            return ScheduleWrite(missed, schedule.version, None)
        if firing.cancel_previous and schedule.last_job_id is not None:
            self._cancel_previous(schedule)
        return ScheduleWrite(firing.schedule, schedule.version, job)

    def _store_writes(self, writes: list[ScheduleWrite]) -> list[bool]:
        stored = self._store.fire_schedules(writes) if writes else []
        made = [
            write.job
            for write, won in zip(writes, stored, strict=True)
            if won and write.job is not None
        ]
        # A job with a concurrency key is made held by it: its key releases it now, as after
        # a create (`keys_declared`), not at the sweeper's repair.
        for job in self._jobs.keys_declared(made):
            self.fired += 1
            self._jobs.job_stored(job)
        return stored

    def _build(self, schedule: Schedule, scheduled_for: Instant) -> Job:
        server = self._store.get_server(schedule.server_id)
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

    # -- helpers -----------------------------------------------------------------------------

    def _previous_running(self, schedule: Schedule) -> bool:
        if schedule.last_job_id is None:
            return False
        job = self._store.get_job(schedule.last_job_id)
        return job is not None and not job.state.is_terminal

    def _accessible(self, actor: User, schedule_id: str) -> Schedule:
        schedule = self._store.get_schedule(schedule_id)
        if schedule is None:
            raise NotFound("no such schedule")
        self._jobs.manageable_server(actor, schedule.server_id)
        return schedule

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

    def _state(self, schedule: Schedule, now: Instant) -> ScheduleState:
        owner = self._store.get_user(schedule.owner_id)
        last = None if schedule.last_job_id is None else self._store.get_job(schedule.last_job_id)
        expression, where = _calendar(schedule.cron, schedule.timezone)
        times = domain.next_times(schedule, expression, where, now)
        return ScheduleState(schedule, last, owner is None or owner.disabled, tuple(times))


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
