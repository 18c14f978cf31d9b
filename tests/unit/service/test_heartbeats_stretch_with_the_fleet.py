"""Past `max_heartbeats_per_s`, a platform process tells its Runs a longer heartbeat interval and
gives their sessions a longer TTL (docs/protocol.md, "Joining and sessions"), on every store.

The bound here is tiny (0.1 heartbeats a second at a 10 s interval: one Run) so that the
world's two endpoints are a fleet past it; on a manual clock, nothing timed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from moonrun.errors import SessionExpired
from tests.support.harness import SETTINGS, World
from tests.support.stores import StoreFactory

SECOND = 1000
ONE_RUN_PER_BOUND = replace(SETTINGS, heartbeat_interval_s=10.0, max_heartbeats_per_s=0.1)


@pytest.fixture
def fleet(store_factory: StoreFactory) -> World:
    world = World(store_factory, ONE_RUN_PER_BOUND)
    yield world  # type: ignore[misc]
    world.store.close()


def two_runs(world: World) -> tuple[str, str]:
    """Both endpoints' Runs registered and heartbeating at this process."""
    first = world.service.register_session(
        world.endpoint.id, boot_id="a", run_version="1.0", capacity=1
    ).session.id
    second = world.service.register_session(
        world.other_endpoint.id, boot_id="b", run_version="1.0", capacity=1
    ).session.id
    world.service.heartbeat(first)
    world.service.heartbeat(second)
    world.clock.advance(3 * SECOND)  # past the cadence's recount
    return first, second


def test_runs_past_the_bound_are_told_a_longer_interval(fleet: World) -> None:
    """Two Runs where the bound allows one: every 20 s, and a registration's TTL doubled."""
    first, _ = two_runs(fleet)
    assert fleet.service.heartbeat(first).heartbeat_interval_s == 20.0
    again = fleet.service.register_session(
        fleet.endpoint.id, boot_id="a2", run_version="1.0", capacity=1
    )
    assert again.heartbeat_interval_s == 20.0
    assert again.session_ttl_s == 2 * ONE_RUN_PER_BOUND.session_ttl_s


def test_a_run_heartbeating_at_the_longer_interval_keeps_its_session_and_shows_online(
    fleet: World,
) -> None:
    """Heartbeats every 20 s, longer than the base TTL's slack allows: the session lives on
    and the endpoint stays online throughout."""
    first, second = two_runs(fleet)
    for _ in range(12):  # 4 minutes, far past the base TTL of 50 s
        fleet.service.heartbeat(first)
        fleet.service.heartbeat(second)
        assert fleet.service.endpoints_online([fleet.endpoint.id]) == {fleet.endpoint.id: True}
        fleet.clock.advance(20 * SECOND - 1)
        assert fleet.service.endpoints_online([fleet.endpoint.id]) == {fleet.endpoint.id: True}
    assert fleet.service.authenticate_session(first).id == first


def test_within_the_bound_nothing_is_stretched(fleet: World) -> None:
    """One Run where the bound allows one: the base interval and TTL."""
    only = fleet.service.register_session(
        fleet.endpoint.id, boot_id="a", run_version="1.0", capacity=1
    )
    fleet.service.heartbeat(only.session.id)
    fleet.clock.advance(3 * SECOND)
    assert fleet.service.heartbeat(only.session.id).heartbeat_interval_s == 10.0
    assert only.session_ttl_s == ONE_RUN_PER_BOUND.session_ttl_s


def test_when_the_fleet_shrinks_a_run_told_the_longer_interval_stays_online_until_it_beats(
    fleet: World,
) -> None:
    """The other Run leaves: this process tells the base interval again, but a Run it told
    20 s is not shown offline before that heartbeat is due."""
    first, second = two_runs(fleet)
    assert fleet.service.heartbeat(first).heartbeat_interval_s == 20.0
    fleet.service.end_session(second)
    fleet.clock.advance(3 * SECOND)
    # Counted again: one Run, so the base bound (15 s) applies to what is told from now on.
    assert fleet.service.endpoints_online([fleet.endpoint.id]) == {fleet.endpoint.id: True}
    fleet.clock.advance(14 * SECOND)  # 17 s after the beat told 20 s
    assert fleet.service.endpoints_online([fleet.endpoint.id]) == {fleet.endpoint.id: True}
    fleet.clock.advance(3 * SECOND)
    assert fleet.service.heartbeat(first).heartbeat_interval_s == 10.0


def test_without_a_bound_the_base_ttl_applies(store_factory: StoreFactory) -> None:
    """`max_heartbeats_per_s` 0: never stretched; a Run beating every 60 s loses its session."""
    world = World(store_factory, replace(ONE_RUN_PER_BOUND, max_heartbeats_per_s=0.0))
    try:
        first, _ = two_runs(world)
        assert world.service.heartbeat(first).heartbeat_interval_s == 10.0
        world.clock.advance(60 * SECOND)
        with pytest.raises(SessionExpired):
            world.service.heartbeat(first)
    finally:
        world.store.close()
