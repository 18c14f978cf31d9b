"""Cron expressions: the syntax, refusals naming the token, and the instants they fire at in a
time zone, daylight saving time included (scheduling/cron.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moonrun.errors import InvalidRequest
from moonrun.scheduling import cron
from moonrun.scheduling.time import Instant, format_instant, parse_instant

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
KOLKATA = ZoneInfo("Asia/Kolkata")
"""+05:30 all year."""
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
"""+10:30, and +11:00 in summer: its clocks move by 30 minutes."""


def at(text: str) -> Instant:
    return parse_instant(text)


def fires(expression: str, after: str, zone: ZoneInfo = BERLIN, count: int = 3) -> list[str]:
    times = cron.parse(expression).times_after(at(after), zone, count)
    return [format_instant(t) for t in times]


# -- syntax ---------------------------------------------------------------------------------


def test_fields_take_lists_ranges_steps_and_names() -> None:
    parsed = cron.parse("*/15 9-17/4 1,15 jan-mar mon-fri")

    assert parsed.minutes == {0, 15, 30, 45}
    assert parsed.hours == {9, 13, 17}
    assert parsed.days == {1, 15}
    assert parsed.months == {1, 2, 3}
    assert parsed.weekdays == {1, 2, 3, 4, 5}


def test_seven_is_sunday_too() -> None:
    assert cron.parse("0 0 * * 7").weekdays == {0}


@pytest.mark.parametrize(
    ("macro", "same_as"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_macros_are_their_five_fields(macro: str, same_as: str) -> None:
    parsed, expected = cron.parse(macro), cron.parse(same_as)

    assert (parsed.minutes, parsed.hours, parsed.days, parsed.months, parsed.weekdays) == (
        expected.minutes,
        expected.hours,
        expected.days,
        expected.months,
        expected.weekdays,
    )


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * * *", "needs 5 fields"),
        ("60 * * * *", "minute: '60' is outside 0-59"),
        ("0 24 * * *", "hour: '24' is outside 0-23"),
        ("0 0 0 * *", "day of month: '0' is outside 1-31"),
        ("0 0 * 13 *", "month: '13' is outside 1-12"),
        ("0 0 * * 8", "day of week: '8' is outside 0-7"),
        ("0 0 * jam *", "month: 'jam' is outside 1-12"),
        ("5-1 * * * *", "minute: '5-1' runs backwards"),
        ("*/0 * * * *", "minute: '*/0' has a bad step"),
        ("0 0 ? * *", "day of month: '?' is not a cron field"),
        ("@sometimes", "unknown macro '@sometimes'"),
        ("0 0 30 2 *", "names no day that exists"),
    ],
)
def test_a_bad_expression_is_refused_naming_the_field_and_token(expression: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=r"^cron") as refused:
        cron.parse(expression)

    assert says in refused.value.message


def test_a_cron_that_is_no_string_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="cron must be a string"):
        cron.parse(42)


# -- when it fires ----------------------------------------------------------------------------


def test_a_daily_time_fires_at_that_wall_clock_time_in_its_zone() -> None:
    assert fires("30 3 * * *", "2026-06-01T00:00:00Z") == [
        "2026-06-01T01:30:00.000Z",  # 03:30 CEST
        "2026-06-02T01:30:00.000Z",
        "2026-06-03T01:30:00.000Z",
    ]


def test_strictly_after_the_instant_given() -> None:
    assert fires("30 3 * * *", "2026-06-01T01:30:00Z", count=1) == ["2026-06-02T01:30:00.000Z"]


def test_either_day_field_matches_when_both_are_restricted() -> None:
    """`0 0 13 * fri`: every 13th and every Friday, as cron has always read it."""
    days = [t[:10] for t in fires("0 0 13 * fri", "2026-04-01T00:00:00Z", NEW_YORK, 4)]

    assert days == ["2026-04-03", "2026-04-10", "2026-04-13", "2026-04-17"]


def test_leap_day_waits_for_a_leap_year() -> None:
    assert fires("0 12 29 2 *", "2026-03-01T00:00:00Z", ZoneInfo("UTC"), 2) == [
        "2028-02-29T12:00:00.000Z",
        "2032-02-29T12:00:00.000Z",
    ]


def test_a_zone_with_a_half_hour_offset() -> None:
    assert fires("0 9 * * *", "2026-06-01T00:00:00Z", KOLKATA, 1) == ["2026-06-01T03:30:00.000Z"]


# -- daylight saving time ------------------------------------------------------------------------


def test_berlin_a_time_skipped_in_spring_fires_once_when_the_clocks_have_jumped() -> None:
    """29 March 2026: 02:00 CET becomes 03:00 CEST; 02:30 does not exist and fires at 03:00."""
    assert fires("30 2 * * *", "2026-03-28T12:00:00Z") == [
        "2026-03-29T01:00:00.000Z",  # 03:00 CEST, the first instant after the jump
        "2026-03-30T00:30:00.000Z",  # 02:30 CEST
        "2026-03-31T00:30:00.000Z",
    ]


def test_berlin_every_time_inside_the_jump_fires_once_between_them() -> None:
    """Every 15 minutes: 02:00, 02:15, 02:30, 02:45 do not exist; one firing at 03:00."""
    assert fires("*/15 * * * *", "2026-03-29T00:40:00Z", count=4) == [
        "2026-03-29T00:45:00.000Z",  # 01:45 CET
        "2026-03-29T01:00:00.000Z",  # 03:00 CEST: the four skipped times and 03:00 itself
        "2026-03-29T01:15:00.000Z",  # 03:15 CEST
        "2026-03-29T01:30:00.000Z",
    ]


def test_berlin_a_time_that_happens_twice_in_autumn_fires_at_its_first_occurrence() -> None:
    """25 October 2026: 03:00 CEST becomes 02:00 CET; 02:30 happens twice, fires once."""
    assert fires("30 2 * * *", "2026-10-24T12:00:00Z") == [
        "2026-10-25T00:30:00.000Z",  # 02:30 CEST, not again at 02:30 CET (01:30Z)
        "2026-10-26T01:30:00.000Z",  # 02:30 CET
        "2026-10-27T01:30:00.000Z",
    ]


def test_berlin_the_repeated_hour_fires_once_even_when_asked_from_inside_it() -> None:
    """Asked at 02:10 CET (the second 02:10), the next is 03:00 CET: the hour's times fired
    already in their first occurrence."""
    assert fires("*/30 * * * *", "2026-10-25T01:10:00Z", count=2) == [
        "2026-10-25T02:00:00.000Z",  # 03:00 CET
        "2026-10-25T02:30:00.000Z",
    ]


def test_new_york_spring_and_autumn() -> None:
    """8 March 2026 02:00 EST -> 03:00 EDT; 1 November 2026 02:00 EDT -> 01:00 EST."""
    assert fires("30 2 * * *", "2026-03-07T12:00:00Z", NEW_YORK, 2) == [
        "2026-03-08T07:00:00.000Z",  # 03:00 EDT
        "2026-03-09T06:30:00.000Z",  # 02:30 EDT
    ]
    assert fires("30 1 * * *", "2026-10-31T12:00:00Z", NEW_YORK, 2) == [
        "2026-11-01T05:30:00.000Z",  # 01:30 EDT, the first of two
        "2026-11-02T06:30:00.000Z",  # 01:30 EST
    ]


def test_lord_howe_whose_clocks_move_by_half_an_hour() -> None:
    """5 April 2026: 02:00 +11:00 becomes 01:30 +10:30, so 01:45 happens twice; 4 October
    2026: 02:00 +10:30 becomes 02:30 +11:00, so 02:15 does not exist."""
    assert fires("45 1 * * *", "2026-04-04T00:00:00Z", LORD_HOWE, 1) == [
        "2026-04-04T14:45:00.000Z"  # 01:45 +11:00, the first of two
    ]
    assert fires("15 2 * * *", "2026-10-03T00:00:00Z", LORD_HOWE, 1) == [
        "2026-10-03T15:30:00.000Z"  # 02:30 +11:00, the first instant after the jump
    ]


# -- against a plain reading of the rules, minute by minute -------------------------------------

ZONES = [BERLIN, NEW_YORK, KOLKATA, LORD_HOWE, ZoneInfo("UTC")]


def reference(expression: str, start: Instant, minutes: int, zone: ZoneInfo) -> list[Instant]:
    """Walk UTC minute by minute: a minute fires if its wall-clock time matches and is that
    time's first occurrence, or if it ends a jump forward over a matching time."""
    parsed = cron.parse(expression)
    found = []
    first = datetime.fromtimestamp(start // 1000, UTC).replace(second=0) + timedelta(minutes=1)
    for n in range(minutes):
        now = first + timedelta(minutes=n)
        local = now.astimezone(zone)
        before = (now - timedelta(minutes=1)).astimezone(zone)
        naive = local.replace(tzinfo=None)
        skipped = []
        jumped = naive - before.replace(tzinfo=None)
        if jumped > timedelta(minutes=1):  # the wall clock jumped over these minutes
            skipped = [
                naive - timedelta(minutes=k) for k in range(1, jumped // timedelta(minutes=1))
            ]
        matching = [
            t
            for t in (naive, *skipped)
            if parsed.day_matches(t.date())
            and t.hour in parsed.hours
            and t.minute in parsed.minutes
        ]
        if matching and (local.fold == 0 or skipped):
            found.append(int(now.timestamp()) * 1000)
    return found


@settings(max_examples=60, deadline=None)
@given(
    minute=st.sampled_from(["*", "0", "*/15", "30", "45", "0,30"]),
    hour=st.sampled_from(["*", "1", "2", "3", "1-3", "*/2"]),
    zone=st.sampled_from(ZONES),
    start=st.sampled_from(
        [
            "2026-03-07T00:00:00Z",
            "2026-03-28T00:00:00Z",
            "2026-10-24T00:00:00Z",
            "2026-10-31T00:00:00Z",
            "2026-04-03T12:00:00Z",
            "2026-10-02T12:00:00Z",
        ]
    ),
)
def test_every_firing_in_three_days_is_what_the_plain_reading_says(
    minute: str, hour: str, zone: ZoneInfo, start: str
) -> None:
    expression = f"{minute} {hour} * * *"
    window = 3 * 24 * 60
    expected = reference(expression, at(start), window, zone)
    parsed = cron.parse(expression)
    got: list[Instant] = []
    moment = at(start)
    end = at(start) + window * 60_000
    while (following := parsed.after(moment, zone)) is not None and following <= end:
        got.append(following)
        moment = following

    assert [format_instant(t) for t in got] == [format_instant(t) for t in expected]
