"""Instants are integer milliseconds since the epoch (UTC); RFC 3339 with a `Z` on the wire."""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime, timedelta

from moonrun.errors import InvalidRequest

Instant = int
"""Milliseconds since 1970-01-01T00:00:00Z."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


def seconds_to_ms(seconds: float) -> int:
    """A duration in seconds as whole milliseconds (rounded to nearest)."""
    return round(seconds * 1000)


def format_instant(instant: Instant) -> str:
    """`2026-11-30T04:00:00.123Z` for an instant."""
    seconds, milliseconds = divmod(instant, 1000)
    return f"{_second(seconds)}.{milliseconds:03d}Z"


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    """`2026-11-30T04:00:00` (the instants of one answer mostly share their seconds)."""
    m = _EPOCH + timedelta(seconds=seconds)
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"


def format_optional(instant: Instant | None) -> str | None:
    """`format_instant`, passing `None` through."""
    return None if instant is None else format_instant(instant)


def parse_instant(text: str, field: str = "timestamp") -> Instant:
    """An RFC 3339 timestamp as an instant; anything else is `InvalidRequest` (which never
    repeats the value: it may be something secret sent in the wrong field)."""
    problem = f"{field} must be an RFC 3339 timestamp such as 2026-11-30T04:00:00.000Z"
    if not isinstance(text, str) or not _RFC3339.match(text):
        raise InvalidRequest(problem)
    try:
        moment = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(problem) from None
    delta = moment - _EPOCH
    return math.floor(delta / timedelta(milliseconds=1))
