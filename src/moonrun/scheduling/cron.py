"""Cron expressions and the instants they name in a time zone, across daylight saving time.

`parse` reads the 5-field syntax (minute, hour, day of month, month, day of week) with lists,
ranges, steps and names (`jan`..`dec`, `sun`..`sat`, 7 also Sunday), `@hourly`, `@daily`
(`@midnight`), `@weekly`, `@monthly`, `@yearly` (`@annually`), and intervals of 1 s to 24 h
(`@every 30s`, `@every 5m`, `@every 2h`: `Every`, in absolute time). As in Vixie cron and its heirs,
when both day fields are restricted a day matches if either does.

`Cron.after(instant, zone)` is the first scheduled instant strictly after `instant`. Times are
wall-clock times in `zone` (a `tzinfo`, e.g. a `zoneinfo.ZoneInfo` the caller loaded: this
module reads no time zone database itself). Across a change of offset:

- a local time that does not exist (the clocks jump forward over it) fires once, at the first
  instant after the jump (Europe/Berlin's 02:30 on the last Sunday of March fires at 03:00
  CEST); several such times of one schedule fire once between them;
- a local time that happens twice (the clocks go back) fires once, at its first occurrence
  (Europe/Berlin's 02:30 on the last Sunday of October fires at 02:30 CEST, not again at 02:30
  CET).

Values in, values out: instants are integer milliseconds since the epoch (`scheduling/time`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

from moonrun.errors import InvalidRequest
from moonrun.scheduling.time import Instant

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MAX_LENGTH = 200
SEARCH_YEARS = 8
"""How far `after` looks for the next time: 29 February of a leap year is at most 8 years off
(1896 to 1904); a schedule with none in that span never fires and is refused at parse."""

_FIELD = re.compile(r"^[a-z0-9*/,-]+$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, MONTHS, 1),
    _Field("day of week", 0, 7, WEEKDAYS, 0),
)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the allowed values of each field."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday (7 is read as 0)."""
    any_day: bool
    """The day-of-month field is `*`."""
    any_weekday: bool
    """The day-of-week field is `*`."""

    def day_matches(self, day: date) -> bool:
        """Whether cron fires on this calendar day (before looking at hours and minutes)."""
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_day and by_weekday
        return by_day or by_weekday

    def after(self, instant: Instant, zone: tzinfo) -> Instant | None:
        """The first scheduled instant strictly after `instant`, or None within
        `SEARCH_YEARS` (only possible for an expression `parse` would refuse)."""
        local = _local(instant, zone)
        start = (local.replace(second=0, microsecond=0) + timedelta(minutes=1)).replace(tzinfo=None)
        for candidate in self._local_times(start):
            fires = _instant_of(candidate, zone)
            if fires > instant:
                return fires
        return None

    def times_after(self, instant: Instant, zone: tzinfo, count: int) -> list[Instant]:
        """The next `count` scheduled instants after `instant`, in order."""
        found: list[Instant] = []
        while len(found) < count:
            following = self.after(instant, zone)
            if following is None:
                break
            found.append(following)
            instant = following
        return found

    def _local_times(self, start: datetime) -> Iterator[datetime]:
        """Every matching naive local time from `start` on, in order, within the search."""
        day = start.date()
        last = date(min(start.year + SEARCH_YEARS, 9999), 12, 31)
        hours, minutes = sorted(self.hours), sorted(self.minutes)
        while day <= last:
            if self.day_matches(day):
                # On the first day, skip the hours and minutes before `start` without making
                # a datetime for each (a minutely calendar has 1,440 a day).
                first_day = day == start.date()
                for hour in hours[bisect.bisect_left(hours, start.hour) :] if first_day else hours:
                    skip = first_day and hour == start.hour
                    for minute in (
                        minutes[bisect.bisect_left(minutes, start.minute) :] if skip else minutes
                    ):
                        yield datetime(day.year, day.month, day.day, hour, minute)
            day += timedelta(days=1)


@dataclass(frozen=True)
class Every:
    """`@every 30s`: every `period_ms` of absolute time, counted from 1970-01-01T00:00Z, so
    every platform derives the same times; no zone moves them and no clock change skips or
    repeats one (`@every 1h` fires at every full UTC hour, also where the offset is 5:30)."""

    text: str
    period_ms: int

    def after(self, instant: Instant, zone: tzinfo) -> Instant | None:
        """The first time strictly after `instant` (the zone is not read)."""
        return (instant // self.period_ms + 1) * self.period_ms

    def times_after(self, instant: Instant, zone: tzinfo, count: int) -> list[Instant]:
        """The next `count` times after `instant`, in order."""
        first = (instant // self.period_ms + 1) * self.period_ms
        return [first + n * self.period_ms for n in range(count)]


Calendar = Cron | Every
"""What a schedule's `cron` names: a cron expression, or an interval (`@every`)."""

EVERY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000}
EVERY_MAX_MS = 24 * 3_600_000
"""An interval is 1 s to 24 h (longer calendars read better as cron: `0 3 * * *`)."""
_EVERY = re.compile(r"^@every\s+([0-9]{1,6})([smh])$")


def parse(text: object) -> Calendar:
    """A cron expression (or an interval, `@every 30s`), or InvalidRequest naming the field
    (`cron`) and the token."""
    if not isinstance(text, str):
        raise InvalidRequest("cron must be a string such as '0 3 * * *' or '@daily'")
    expression = text.strip().lower()
    if len(expression) > MAX_LENGTH:
        raise InvalidRequest(f"cron is longer than {MAX_LENGTH} characters")
    if expression.startswith("@every"):
        return _every(text.strip(), expression)
    if expression.startswith("@"):
        if expression not in MACROS:
            known = ", ".join([*sorted(MACROS), "@every 30s"])
            raise InvalidRequest(f"cron: unknown macro {_shown(expression)} (known: {known})")
        expression = MACROS[expression]
    tokens = expression.split()
    if len(tokens) != 5:
        raise InvalidRequest(
            f"cron needs 5 fields (minute hour day-of-month month day-of-week), not {len(tokens)}"
        )
    values = [_values(field, token) for field, token in zip(_FIELDS, tokens, strict=True)]
    weekdays = frozenset(0 if day == 7 else day for day in values[4])
    cron = Cron(
        text.strip(),
        frozenset(values[0]),
        frozenset(values[1]),
        frozenset(values[2]),
        frozenset(values[3]),
        weekdays,
        any_day=tokens[2] == "*",
        any_weekday=tokens[4] == "*",
    )
    if not _fires_ever(cron):
        raise InvalidRequest(f"cron {_shown(text.strip())} names no day that exists")
    return cron


def _every(text: str, expression: str) -> Every:
    found = _EVERY.match(expression)
    if found is None:
        raise InvalidRequest(
            f"cron: {_shown(text)} is no interval (a number and s, m or h: '@every 30s')"
        )
    period = int(found.group(1)) * EVERY_UNITS[found.group(2)]
    if not 1000 <= period <= EVERY_MAX_MS:
        raise InvalidRequest(f"cron: {_shown(text)} is outside 1s-24h")
    return Every(text, period)


def _values(field: _Field, token: str) -> set[int]:
    if not _FIELD.match(token):
        raise InvalidRequest(f"cron {field.name}: {_shown(token)} is not a cron field")
    found: set[int] = set()
    for part in token.split(","):
        found |= _part(field, part, token)
    return found


def _part(field: _Field, part: str, token: str) -> set[int]:
    body, slash, step_text = part.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or not 0 < int(step_text) <= field.high:
            raise InvalidRequest(f"cron {field.name}: {_shown(token)} has a bad step")
        step = int(step_text)
    if body == "*":
        low, high = field.low, field.high
    elif "-" in body:
        first, _, last = body.partition("-")
        low, high = _number(field, first, token), _number(field, last, token)
        if low > high:
            raise InvalidRequest(f"cron {field.name}: {_shown(token)} runs backwards")
    else:
        low = _number(field, body, token)
        high = field.high if slash else low
    return set(range(low, high + 1, step))


def _number(field: _Field, text: str, token: str) -> int:
    if text in field.names:
        return field.names.index(text) + field.name_base
    if not text.isdigit() or len(text) > 2 or not field.low <= int(text) <= field.high:
        raise InvalidRequest(
            f"cron {field.name}: {_shown(token)} is outside {field.low}-{field.high}"
        )
    return int(text)


def _fires_ever(cron: Cron) -> bool:
    """Whether some day of an 8-year span (so every weekday of every month, 29 February
    included) matches: `0 0 31 2 *` never does."""
    day = date(2024, 1, 1)
    for _ in range(366 * SEARCH_YEARS):
        if cron.day_matches(day):
            return True
        day += timedelta(days=1)
    return False


def _shown(text: str) -> str:
    """A token quoted for an error message, cut short (it is echoed back)."""
    return repr(text[:40])


def _local(instant: Instant, zone: tzinfo) -> datetime:
    return (_EPOCH + timedelta(milliseconds=instant)).astimezone(zone)


def _instant(moment: datetime) -> Instant:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _exists(local: datetime, zone: tzinfo) -> bool:
    """Whether a naive local time happens in `zone` (it does not inside a jump forward)."""
    aware = local.replace(tzinfo=zone)
    return aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == local


def _instant_of(local: datetime, zone: tzinfo) -> Instant:
    """When a naive local time happens: its first occurrence if it happens twice; the first
    instant after the jump if it does not happen at all."""
    while not _exists(local, zone):
        local += timedelta(minutes=1)  # offsets change on whole minutes
    return _instant(local.replace(tzinfo=zone, fold=0))
