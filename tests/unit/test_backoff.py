"""The one backoff: ceilings grow by the multiplier up to the cap; pauses are full jitter."""

from __future__ import annotations

import itertools

import pytest

from moonrun.backoff import Backoff


def test_the_ceiling_grows_by_the_multiplier_and_stops_at_the_cap() -> None:
    backoff = Backoff(initial_s=0.5, max_s=10.0)

    assert [backoff.ceiling(retry) for retry in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_a_huge_retry_number_still_gives_the_cap() -> None:
    assert Backoff(initial_s=0.2, max_s=5.0, multiplier=3).ceiling(10**6) == 5.0


def test_each_pause_is_the_draw_times_its_retrys_ceiling() -> None:
    draws = iter([0.0, 0.5, 0.999, 0.25])
    backoff = Backoff(initial_s=1.0, max_s=3.0, draw=lambda: next(draws))

    pauses = list(itertools.islice(backoff.delays(), 4))

    assert pauses == [0.0, 1.0, pytest.approx(2.997), 0.75]


def test_pauses_spread_over_the_whole_range_below_the_ceiling() -> None:
    """Full jitter: with the real draw, pauses fall anywhere in [0, ceiling), not near it."""
    pauses = list(itertools.islice(Backoff(initial_s=1.0, max_s=1.0).delays(), 2000))

    assert all(0 <= pause < 1.0 for pause in pauses)
    assert min(pauses) < 0.05
    assert max(pauses) > 0.95


def test_a_fresh_iterator_starts_again_from_the_initial_ceiling() -> None:
    backoff = Backoff(initial_s=1.0, max_s=8.0, draw=lambda: 1.0)
    spent = backoff.delays()
    assert list(itertools.islice(spent, 4)) == [1.0, 2.0, 4.0, 8.0]

    assert next(backoff.delays()) == 1.0


@pytest.mark.parametrize(
    ("initial_s", "max_s", "multiplier"),
    [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (-1.0, 1.0, 2.0), (1.0, 2.0, 0.5)],
)
def test_a_backoff_that_could_not_wait_is_refused(
    initial_s: float, max_s: float, multiplier: float
) -> None:
    with pytest.raises(ValueError, match="a backoff needs"):
        Backoff(initial_s, max_s, multiplier)
