"""The heartbeat interval stretches with the fleet (scheduling/cadence.py)."""

from __future__ import annotations

import pytest

from moonrun.scheduling.cadence import heartbeat_stretch


@pytest.mark.parametrize("runs", [0, 1, 500, 1000])
def test_a_fleet_within_the_bound_is_not_stretched(runs: int) -> None:
    """Up to 1,000 Runs heartbeating every 10 s send at most 100 a second: as they are."""
    assert heartbeat_stretch(runs, 10.0, 100.0) == 1.0


def test_a_fleet_past_the_bound_is_stretched_to_it() -> None:
    """5,000 Runs at 100 heartbeats a second: every 50 s, five times the interval."""
    assert heartbeat_stretch(5000, 10.0, 100.0) == 5.0


def test_stretches_are_whole_half_steps_rounded_up() -> None:
    """A few Runs more or less do not change what Runs are told; never more than the bound."""
    assert heartbeat_stretch(1001, 10.0, 100.0) == 1.5
    assert heartbeat_stretch(1500, 10.0, 100.0) == 1.5
    assert heartbeat_stretch(1501, 10.0, 100.0) == 2.0


def test_no_bound_never_stretches() -> None:
    assert heartbeat_stretch(1_000_000, 10.0, 0.0) == 1.0
