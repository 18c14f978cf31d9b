"""Instants: integer milliseconds on the inside, RFC 3339 with milliseconds and `Z` on the wire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import InvalidRequest
from moonrun.scheduling.time import format_instant, format_optional, parse_instant, seconds_to_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
YEAR_1 = -62_135_596_800_000
"""0001-01-01T00:00:00.000Z, the earliest instant RFC 3339 can write."""
YEAR_9999_END = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the latest instant RFC 3339 can write."""

instants = st.integers(min_value=YEAR_1, max_value=YEAR_9999_END)
offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


def ms_since_epoch(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("instant", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1, "1970-01-01T00:00:00.001Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (1_780_000_000_123, "2026-05-28T20:26:40.123Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        (YEAR_9999_END, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_format_known_instants(instant: int, text: str) -> None:
    """Instants render as YYYY-MM-DDTHH:MM:SS.mmmZ in UTC."""
    assert text == format_instant(instant)
    assert instant == parse_instant(text)


@given(instant=instants)
def test_format_then_parse_round_trips(instant: int) -> None:
    """parse_instant(format_instant(i)) == i for every instant from year 1 to 9999."""
    assert instant == parse_instant(format_instant(instant))


@given(instant=instants)
def test_formatted_instant_has_the_wire_shape(instant: int) -> None:
    """Every formatted instant is exactly 24 characters ending in milliseconds and Z."""
    text = format_instant(instant)
    expected = (24, "T", ".", "Z")
    assert expected == (len(text), text[10], text[19], text[-1])


@given(
    moment=st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 30)),
    zone=offsets,
)
def test_parse_accepts_any_offset(moment: datetime, zone: timezone) -> None:
    """An offset timestamp parses to the same instant as its UTC equivalent."""
    local = moment.replace(tzinfo=zone)
    expected = ms_since_epoch(local.replace(microsecond=local.microsecond // 1000 * 1000))
    assert expected == parse_instant(local.isoformat(timespec="milliseconds"))


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-30T06:00:00+02:00",
        "2026-11-29T22:30:00-05:30",
        "2026-11-30T04:00:00+00:00",
        "2026-11-30T04:00:00-00:00",
        "2026-11-30t04:00:00z",
        "2026-11-30T04:00:00Z",
        "2026-11-30T04:00:00.000Z",
    ],
)
def test_equivalent_spellings_parse_to_the_same_instant(text: str) -> None:
    """Offsets, lowercase t/z and an omitted fraction all denote the same instant."""
    expected = 1_796_011_200_000
    assert expected == parse_instant(text)


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("2026-11-30T04:00:00.1Z", 1_796_011_200_100),
        ("2026-11-30T04:00:00.12Z", 1_796_011_200_120),
        ("2026-11-30T04:00:00.1239Z", 1_796_011_200_123),
        ("2026-11-30T04:00:00.123999999Z", 1_796_011_200_123),
        ("1969-12-31T23:59:59.9995Z", -1),
    ],
)
def test_sub_millisecond_fractions_round_down(text: str, instant: int) -> None:
    """Fractions of 1 to 9 digits are accepted and floored to the millisecond."""
    assert instant == parse_instant(text)


def plain_id(text: str) -> str:
    """A test id of ASCII letters, digits and `-:+.` only (anything else spelt out), so that a
    test runner can name the case on a command line and find it again (mutmut does)."""
    spelt = {" ": "_sp_", "\n": "_nl_"}
    kept = "".join(
        c if c.isascii() and (c.isalnum() or c in "-:+.") else spelt.get(c, f"_u{ord(c):04x}_")
        for c in text
    )
    return kept or "_empty_"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "now",
        "yesterday",
        "1796011200000",
        "2026-11-30",
        "04:00:00Z",
        "2026-11-30T04:00:00",
        "2026-11-30 04:00:00Z",
        "2026-11-30T04:00Z",
        "2026-11-30T04:00:00.Z",
        "2026-11-30T04:00:00.1234567890Z",
        "2026-11-30T04:00:00+0200",
        "2026-11-30T04:00:00+02",
        "2026-11-30T04:00:00+24:00",
        "2026-11-30T04:00:00UTC",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-11-31T00:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T04:60:00Z",
        "2026-11-30T04:00:60Z",
        "26-11-30T04:00:00Z",
        "+2026-11-30T04:00:00Z",
        " 2026-11-30T04:00:00Z",
        "2026-11-30T04:00:00Z ",
        "2026-11-30T04:00:00Z\n",
        "2026-11-30T04:00:00ZZ",
        "\uff12\uff10\uff12\uff16-11-30T04:00:00Z",  # full-width digits
        "2026-11-30T04:00:00.\u0661\u0662\u0663Z",  # Arabic-Indic digits
    ],
    ids=plain_id,
)
def test_parse_rejects_garbage(text: str) -> None:
    """Anything but a complete RFC 3339 date-time with an offset is InvalidRequest."""
    with pytest.raises(InvalidRequest):
        parse_instant(text)


def test_parse_error_message_is_bounded() -> None:
    """A huge bad value is quoted only in part in the error message."""
    with pytest.raises(InvalidRequest) as caught:
        parse_instant("x" * 10_000)
    assert len(caught.value.message) < 200


def test_format_optional_passes_none_through() -> None:
    """None stays None; an instant is formatted."""
    expected = (None, "1970-01-01T00:00:01.000Z")
    assert expected == (format_optional(None), format_optional(1_000))


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [(0, 0), (1, 1_000), (1.5, 1_500), (0.0004, 0), (0.0006, 1), (604_800.0, 604_800_000)],
)
def test_seconds_to_ms_rounds_to_the_nearest_millisecond(seconds: float, ms: int) -> None:
    """Durations convert to whole milliseconds, rounded to nearest."""
    assert ms == seconds_to_ms(seconds)
