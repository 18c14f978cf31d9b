"""RetryPolicy: bounded attempts, capped exponential backoff, jitter that only shortens."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import InvalidRequest
from moonrun.scheduling.retry import MAX_ATTEMPTS_LIMIT, MAX_BACKOFF_S, RetryPolicy
from moonrun.scheduling.time import seconds_to_ms

seconds = st.floats(min_value=0.0, max_value=MAX_BACKOFF_S, allow_nan=False)
multipliers = st.floats(min_value=1.0, max_value=100.0, allow_nan=False)
jitters = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True, allow_nan=False)
attempts = st.integers(min_value=1, max_value=MAX_ATTEMPTS_LIMIT)
moderate_attempts = st.integers(min_value=1, max_value=40)


@st.composite
def policies(draw: st.DrawFn, jitter: st.SearchStrategy[float] = jitters) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=draw(attempts),
        initial_s=draw(seconds),
        multiplier=draw(multipliers),
        max_s=draw(seconds),
        jitter=draw(jitter),
    )


def valid_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "max_attempts": 3,
        "initial_s": 1.0,
        "multiplier": 2.0,
        "max_s": 60.0,
        "jitter": 0.0,
    }
    fields.update(overrides)
    return fields


# -- the cap ---------------------------------------------------------------------------------


@given(policy=policies(), attempt=attempts)
def test_backoff_seconds_never_exceed_max_s(policy: RetryPolicy, attempt: int) -> None:
    """The un-jittered delay is never above max_s."""
    assert policy.backoff_s(attempt) <= policy.max_s


@given(policy=policies(), attempt=attempts, draw=draws)
def test_backoff_ms_never_exceeds_the_cap_with_any_jitter_and_draw(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    """Whatever the jitter and draw, the wait is at most max_s in whole milliseconds."""
    assert policy.backoff_ms(attempt, draw) <= seconds_to_ms(policy.max_s)


# -- shape of the curve ----------------------------------------------------------------------


@given(policy=policies(jitter=st.just(0.0)), attempt=st.integers(1, MAX_ATTEMPTS_LIMIT - 1))
def test_backoff_is_non_decreasing_in_attempt_without_jitter(
    policy: RetryPolicy, attempt: int
) -> None:
    """Without jitter a later attempt never waits less than an earlier one."""
    assert policy.backoff_s(attempt) <= policy.backoff_s(attempt + 1)
    assert policy.backoff_ms(attempt) <= policy.backoff_ms(attempt + 1)


@given(policy=policies(jitter=st.just(0.0)), attempt=moderate_attempts)
def test_backoff_matches_the_closed_formula_for_moderate_attempts(
    policy: RetryPolicy, attempt: int
) -> None:
    """backoff(a) == min(max_s, initial_s * multiplier**(a-1)) up to float rounding."""
    expected = min(policy.max_s, policy.initial_s * policy.multiplier ** (attempt - 1))
    actual = policy.backoff_s(attempt)
    assert math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-12), (expected, actual)


def test_backoff_known_values() -> None:
    """1 s doubling, capped at 10 s: 1, 2, 4, 8, 10, 10 seconds."""
    policy = RetryPolicy(max_attempts=10, initial_s=1.0, multiplier=2.0, max_s=10.0)
    expected = [1_000, 2_000, 4_000, 8_000, 10_000, 10_000]
    assert expected == [policy.backoff_ms(attempt) for attempt in range(1, 7)]


@pytest.mark.parametrize("attempt", [1_000, 100_000])
def test_huge_attempts_with_the_largest_multiplier_do_not_overflow(attempt: int) -> None:
    """Attempt 1000+ with multiplier 100 stays finite and equals the cap."""
    policy = RetryPolicy(
        max_attempts=MAX_ATTEMPTS_LIMIT, initial_s=MAX_BACKOFF_S, multiplier=100.0, max_s=60.0
    )
    small_start = RetryPolicy(
        max_attempts=MAX_ATTEMPTS_LIMIT, initial_s=0.001, multiplier=100.0, max_s=MAX_BACKOFF_S
    )
    expected = (60.0, MAX_BACKOFF_S, seconds_to_ms(MAX_BACKOFF_S))
    actual = (
        policy.backoff_s(attempt),
        small_start.backoff_s(attempt),
        small_start.backoff_ms(attempt, 0.5),
    )
    assert expected == actual


def test_zero_initial_delay_stays_zero() -> None:
    """A zero initial delay never grows, however many attempts."""
    policy = RetryPolicy(max_attempts=MAX_ATTEMPTS_LIMIT, initial_s=0.0, multiplier=100.0, max_s=5)
    expected = 0
    assert expected == policy.backoff_ms(MAX_ATTEMPTS_LIMIT)


def test_attempt_below_one_is_invalid() -> None:
    """There is no backoff before attempt 1."""
    with pytest.raises(InvalidRequest):
        RetryPolicy(**valid_fields()).backoff_s(0)


# -- jitter ----------------------------------------------------------------------------------


@given(policy=policies(), attempt=attempts, draw=draws)
def test_jitter_only_lowers_the_delay(policy: RetryPolicy, attempt: int, draw: float) -> None:
    """A draw never lengthens the wait beyond the draw-free delay."""
    assert policy.backoff_ms(attempt, draw) <= policy.backoff_ms(attempt, 0.0)


@given(policy=policies(), attempt=attempts, draw=draws)
def test_jitter_never_takes_more_than_its_fraction(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    """The jittered wait is at least (1 - jitter) * base (in whole milliseconds)."""
    floor = seconds_to_ms(policy.backoff_s(attempt) * (1.0 - policy.jitter))
    assert floor <= policy.backoff_ms(attempt, draw)


@given(policy=policies(jitter=st.just(0.0)), attempt=attempts, draw=draws)
def test_draw_changes_nothing_without_jitter(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    """With jitter 0 every draw gives the base delay."""
    assert seconds_to_ms(policy.backoff_s(attempt)) == policy.backoff_ms(attempt, draw)


def test_half_jitter_with_half_draw_takes_a_quarter() -> None:
    """jitter 0.5 and draw 0.5 remove a quarter of an 8 s delay."""
    policy = RetryPolicy(max_attempts=5, initial_s=8.0, multiplier=2.0, max_s=60.0, jitter=0.5)
    expected = 6_000
    assert expected == policy.backoff_ms(1, 0.5)


@pytest.mark.parametrize("draw", [-0.0001, 1.0, 1.5, -1.0, math.nan, math.inf, -math.inf], ids=repr)
def test_draw_outside_unit_interval_is_invalid(draw: float) -> None:
    """A jitter draw must lie in [0, 1)."""
    policy = RetryPolicy(**valid_fields(jitter=0.5))
    with pytest.raises(InvalidRequest):
        policy.backoff_ms(1, draw)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", -1),
        ("max_attempts", MAX_ATTEMPTS_LIMIT + 1),
        ("max_attempts", True),
        ("max_attempts", 2.0),
        ("max_attempts", "3"),
        ("max_attempts", None),
        ("initial_s", -0.001),
        ("initial_s", math.nan),
        ("initial_s", math.inf),
        ("initial_s", True),
        ("initial_s", MAX_BACKOFF_S + 1),
        ("initial_s", "1"),
        ("multiplier", 0.999),
        ("multiplier", 0.0),
        ("multiplier", 100.001),
        ("multiplier", math.nan),
        ("multiplier", math.inf),
        ("multiplier", True),
        ("max_s", -1.0),
        ("max_s", MAX_BACKOFF_S + 1),
        ("max_s", math.nan),
        ("max_s", math.inf),
        ("max_s", -math.inf),
        ("max_s", False),
        ("jitter", -0.01),
        ("jitter", 1.01),
        ("jitter", math.nan),
        ("jitter", math.inf),
        ("jitter", True),
    ],
    ids=repr,
)
def test_invalid_policy_is_rejected(field: str, value: object) -> None:
    """Out-of-range, non-finite, boolean or non-numeric settings raise InvalidRequest."""
    with pytest.raises(InvalidRequest):
        RetryPolicy(**valid_fields(**{field: value}))


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_attempts": 1},
        {"max_attempts": MAX_ATTEMPTS_LIMIT},
        {"initial_s": 0},
        {"initial_s": MAX_BACKOFF_S},
        {"multiplier": 1},
        {"multiplier": 100.0},
        {"max_s": 0.0},
        {"max_s": MAX_BACKOFF_S},
        {"jitter": 1.0},
    ],
    ids=repr,
)
def test_boundary_policies_are_valid(overrides: dict[str, Any]) -> None:
    """Each limit itself is allowed, and integers are fine for the float settings."""
    fields = valid_fields(**overrides)
    policy = RetryPolicy(**fields)
    assert fields == {name: getattr(policy, name) for name in fields}


@pytest.mark.parametrize(
    ("max_attempts", "attempt", "expected"),
    [(3, 1, True), (3, 2, True), (3, 3, False), (1, 1, False)],
)
def test_allows_another_attempt_until_the_budget_is_spent(
    max_attempts: int, attempt: int, expected: bool
) -> None:
    """Attempt n may be followed by another only while n < max_attempts."""
    policy = RetryPolicy(**valid_fields(max_attempts=max_attempts))
    assert expected == policy.allows_another_attempt(attempt)
