"""Recurring schedules: which calendar time fires, which is skipped or missed, values in and out.

A schedule keeps a cursor, `next_at`: the earliest calendar time not yet decided. Deciding
(`decide`) takes every time from the cursor up to `now` at once and moves the cursor past
`now`, so a platform that was down, or a schedule that was paused, never fires a burst:

- the latest of those times fires if it lies within the catch-up window (or within
  `ON_TIME_MS`, which a platform that is up always meets); every earlier one is *missed*
  (counted, never fired), and so is the latest when it lies outside the window;
- a time that fires while the previous firing's job is not terminal follows `overlap`:
  `skip` counts it as *skipped*, `allow` fires beside it, `cancel_previous` asks the previous
  job to cancel and fires;
- a time whose server's owner is disabled is missed.

A schedule names a server, or a label `selector` instead: then each firing is a fan-out group,
one job on every server its creator may submit to whose labels match at the firing time
(`scheduling/groups.py`), and the overlap policy looks at the previous firing's group (running
while any of its jobs has not ended). A firing whose selector matches no server is recorded
(`nothing_matched`: counted in `unmatched`, its time shown with no group), never retried.

Exactly once: the job of a firing has an id derived from (schedule, scheduled time)
(`firing_job_id`), and a selector firing's group and jobs from (schedule, time[, server])
(`firing_group_id`, `group_job_id`), so however many platforms, restarts or retries decide the
same time, the store holds at most one job (or group) for it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import tzinfo
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from moonrun.errors import InvalidRequest
from moonrun.scheduling import cron as cron_domain
from moonrun.scheduling.time import Instant

ON_TIME_MS = 5_000
"""A time decided this late is on time whatever the catch-up window: the platform was up, its
firing loop was only slow."""
DEFAULT_CATCHUP_WINDOW_S = 60
MAX_CATCHUP_WINDOW_S = 31 * 24 * 3600
MAX_COUNTED = 1_000
"""Missed times counted one by one at most: a longer gap jumps to its last time and counts
this many (each step costs a calendar search, and a firing pass must stay short)."""
NAME_MAX = 64
ZONE_MAX = 64
NEXT_TIMES = 5


class Overlap(StrEnum):
    """What a calendar time does while the previous firing's job is not terminal."""

    SKIP = "skip"
    ALLOW = "allow"
    CANCEL_PREVIOUS = "cancel_previous"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring job of one server (or of the servers a selector matches): the calendar, the
    job it makes, and its cursor."""

    id: str
    server_id: str | None
    """The server each firing makes a job on; None for a selector schedule."""
    owner_id: str
    """The server's owner, whose job each firing makes (servers never change owner); for a
    selector schedule its creator, whose groups its firings are and whose access to servers
    its selector is matched within at each firing."""
    name: str
    cron: str
    timezone: str
    job_json: str
    """Canonical JSON of the job each firing creates: `kind`, `payload` and the create options."""
    overlap: Overlap
    catchup_window_s: int
    paused: bool
    created_at: Instant
    next_at: Instant | None
    """The earliest calendar time not yet decided; None: the calendar has no more times."""
    version: int = 1
    last_scheduled_for: Instant | None = None
    last_job_id: str | None = None
    skipped: int = 0
    missed: int = 0
    selector: str | None = None
    """A label selector in place of a server: each firing is a group (`server_id` is None)."""
    max_parallel: int | None = None
    """A selector firing's group's `max_parallel` (None: no limit)."""
    stop_on_failure: bool = False
    """A selector firing's group's `stop_on_failure`."""
    last_group_id: str | None = None
    """The group the last selector firing made (None: none, or nothing matched)."""
    unmatched: int = 0
    """Selector firings that matched no server: recorded, no group made."""

    @property
    def fans_out(self) -> bool:
        """Its firings are groups over the servers its selector matches."""
        return self.selector is not None


@dataclass(frozen=True, slots=True)
class Firing:
    """What deciding a schedule's due times comes to."""

    schedule: Schedule
    """The schedule after the decision: its cursor past `now`, its counts updated."""
    scheduled_for: Instant | None
    """The time to fire a job for, or None (nothing due, or the due times were missed or
    skipped)."""
    cancel_previous: bool = False
    """Ask `schedule.last_job_id`'s job (as it was before this firing) to cancel first."""


def zone(name: object) -> tzinfo:
    """An IANA time zone by name, or InvalidRequest naming the field."""
    if not isinstance(name, str) or not 0 < len(name) <= ZONE_MAX or name.startswith("/"):
        raise InvalidRequest("timezone must be an IANA time zone name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(f"timezone: unknown time zone {name[:40]!r}") from None


def first_cursor(expression: cron_domain.Calendar, where: tzinfo, now: Instant) -> Instant | None:
    """A new (or resumed-from-scratch) schedule's cursor: its first time after `now`."""
    return expression.after(now, where)


def next_times(
    schedule: Schedule, expression: cron_domain.Calendar, where: tzinfo, now: Instant
) -> list[Instant]:
    """The next `NEXT_TIMES` calendar times that may fire: from the cursor when it is still
    ahead, else from `now`."""
    start = schedule.next_at
    if start is None:
        return []
    if start > now:
        return [start, *expression.times_after(start, where, NEXT_TIMES - 1)]
    return expression.times_after(now, where, NEXT_TIMES)


def decide(
    schedule: Schedule,
    expression: cron_domain.Calendar,
    where: tzinfo,
    now: Instant,
    *,
    previous_running: bool,
    owner_enabled: bool,
) -> Firing:
    """Decide every calendar time from the cursor up to `now` (see the module docstring).

    `previous_running`: the job of the schedule's last firing exists and is not terminal (for a
    selector schedule: its group has a job that is not terminal).
    """
    due = schedule.next_at
    if due is None or due > now:
        return Firing(schedule, None)
    latest, earlier = _latest_due(expression, where, due, now)
    following = expression.after(latest, where)
    missed = schedule.missed + earlier
    window_ms = max(schedule.catchup_window_s * 1000, ON_TIME_MS)
    moved = dataclasses.replace(schedule, next_at=following, version=schedule.version + 1)
    if now - latest > window_ms or not owner_enabled:
        return Firing(dataclasses.replace(moved, missed=missed + 1), None)
    return fire(dataclasses.replace(moved, missed=missed), latest, previous_running)


def fire(schedule: Schedule, scheduled_for: Instant, previous_running: bool) -> Firing:
    """Fire `scheduled_for` under the overlap policy (the calendar's due time, or a trigger's
    now); the cursor is the caller's business."""
    if previous_running and schedule.overlap is Overlap.SKIP:
        return Firing(dataclasses.replace(schedule, skipped=schedule.skipped + 1), None)
    cancel = previous_running and schedule.overlap is Overlap.CANCEL_PREVIOUS
    if schedule.fans_out:
        fired = dataclasses.replace(
            schedule,
            last_scheduled_for=scheduled_for,
            last_job_id=None,
            last_group_id=firing_group_id(schedule.id, scheduled_for),
        )
    else:
        fired = dataclasses.replace(
            schedule,
            last_scheduled_for=scheduled_for,
            last_job_id=firing_job_id(schedule.id, scheduled_for),
        )
    return Firing(fired, scheduled_for, cancel_previous=cancel)


def nothing_matched(firing: Firing) -> Firing:
    """A selector firing whose selector matched no server: its time is recorded as the last
    firing, with no group, and counted in `unmatched` (the cursor has moved on: it is never
    fired again). It is a firing all the same: under `cancel_previous` the previous group is
    still asked to cancel."""
    schedule = firing.schedule
    recorded = dataclasses.replace(schedule, last_group_id=None, unmatched=schedule.unmatched + 1)
    return Firing(recorded, None, cancel_previous=firing.cancel_previous)


def firing_job_id(schedule_id: str, scheduled_for: Instant) -> str:
    """The id of the one job a (schedule, time) may make: shaped like every job id
    (`job_` and 16 base32 characters), the same on every platform and after every restart."""
    digest = hashlib.sha256(f"{schedule_id}\0{scheduled_for}".encode()).digest()
    return "job_" + base64.b32encode(digest[:10]).decode().lower()


def firing_group_id(schedule_id: str, scheduled_for: Instant) -> str:
    """The id of the one group a selector schedule's (schedule, time) may make: shaped like
    every group id, the same on every platform and after every restart."""
    return "grp_" + _digest(f"{schedule_id}\0{scheduled_for}\0group")


def group_job_id(schedule_id: str, scheduled_for: Instant, server_id: str) -> str:
    """The id of the one job a selector firing makes on `server_id`."""
    return "job_" + _digest(f"{schedule_id}\0{scheduled_for}\0{server_id}")


def _digest(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.b32encode(digest[:10]).decode().lower()


def _latest_due(
    expression: cron_domain.Calendar, where: tzinfo, due: Instant, now: Instant
) -> tuple[Instant, int]:
    """The last calendar time `<= now` from `due` on, and how many came before it."""
    latest, earlier = due, 0
    while earlier < MAX_COUNTED:
        following = expression.after(latest, where)
        if following is None or following > now:
            return latest, earlier
        latest, earlier = following, earlier + 1
    # A gap longer than MAX_COUNTED times: jump to the last time before `now` without
    # counting the rest one by one (a minutely schedule down for months).
    jumped = _last_before(expression, where, now)
    return (jumped if jumped is not None and jumped > latest else latest), earlier


def _last_before(expression: cron_domain.Calendar, where: tzinfo, now: Instant) -> Instant | None:
    """The last calendar time `<= now`: the last one found in a window ending at `now`, the
    window doubling from an hour until it holds one (so the steps stay few both for a
    minutely calendar and for a yearly one)."""
    window = 3600 * 1000
    horizon = 366 * 24 * 3600 * 1000 * cron_domain.SEARCH_YEARS
    while window <= horizon:
        found = None
        moment = expression.after(now - window, where)
        while moment is not None and moment <= now:
            found, moment = moment, expression.after(moment, where)
        if found is not None:
            return found
        window *= 2
    return None
