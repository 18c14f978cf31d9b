"""Interval calendars (`@every 30s`): times every period of absolute time from the epoch, the
same in every zone and across daylight saving time; bad intervals are refused naming the
token (scheduling/cron.py)."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling import cron
from moonrun.scheduling.time import format_instant, parse_instant

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
KOLKATA = ZoneInfo("Asia/Kolkata")


def fires(expression: str, after: str, zone: ZoneInfo = BERLIN, count: int = 3) -> list[str]:
    times = cron.parse(expression).times_after(parse_instant(after), zone, count)
    return [format_instant(t) for t in times]


@pytest.mark.parametrize(
    ("expression", "period_ms"),
    [
        ("@every 1s", 1000),
        ("@every 30s", 30_000),
        ("@EVERY 5m", 300_000),
        ("@every  2h", 7_200_000),
    ],
)
def test_an_interval_is_a_number_and_a_unit(expression: str, period_ms: int) -> None:
    parsed = cron.parse(expression)

    assert isinstance(parsed, cron.Every)
    assert parsed.period_ms == period_ms
    assert parsed.text == expression


def test_interval_times_are_whole_periods_from_the_epoch() -> None:
    assert fires("@every 2s", "2026-01-01T00:00:00.500Z") == [
        "2026-01-01T00:00:02.000Z",
        "2026-01-01T00:00:04.000Z",
        "2026-01-01T00:00:06.000Z",
    ]
    # Strictly after: a time itself is not its own next time.
    assert fires("@every 1m", "2026-01-01T00:01:00.000Z", count=1) == ["2026-01-01T00:02:00.000Z"]


def test_no_zone_moves_an_interval_nor_does_a_change_of_offset() -> None:
    """`@every 1h` fires at every full UTC hour: in Kolkata (+05:30) at half past, and across
    Berlin's jump forward and New York's fall back with none skipped and none twice."""
    assert fires("@every 1h", "2026-03-29T00:10:00Z", BERLIN, 3) == [
        "2026-03-29T01:00:00.000Z",  # 02:00 CET does not exist in Berlin: fires all the same
        "2026-03-29T02:00:00.000Z",
        "2026-03-29T03:00:00.000Z",
    ]
    assert fires("@every 1h", "2026-11-01T04:30:00Z", NEW_YORK, 3) == [
        "2026-11-01T05:00:00.000Z",  # 01:00 EDT
        "2026-11-01T06:00:00.000Z",  # 01:00 EST: the hour that happens twice, once each
        "2026-11-01T07:00:00.000Z",
    ]
    assert fires("@every 1h", "2026-06-01T00:10:00Z", KOLKATA, 1) == ["2026-06-01T01:00:00.000Z"]


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("@every", "'@every' is no interval"),
        ("@every 10", "'@every 10' is no interval"),
        ("@every 1.5s", "'@every 1.5s' is no interval"),
        ("@every 5d", "'@every 5d' is no interval"),
        ("@every -5s", "'@every -5s' is no interval"),
        ("@every 0s", "'@every 0s' is outside 1s-24h"),
        ("@every 25h", "'@every 25h' is outside 1s-24h"),
        ("@every 86401s", "'@every 86401s' is outside 1s-24h"),
    ],
)
def test_a_bad_interval_is_refused_naming_the_field_and_the_token(
    expression: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        cron.parse(expression)

    assert refused.value.message.startswith("cron: ")
    assert words in refused.value.message


def test_an_unknown_macro_names_the_interval_form_among_those_known() -> None:
    with pytest.raises(InvalidRequest) as refused:
        cron.parse("@sometimes")

    assert "@every 30s" in refused.value.message
