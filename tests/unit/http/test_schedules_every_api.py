"""Interval schedules over the user API (`"cron": "@every 2s"`): each whole period fires one
job, the view shows the next times a period apart, and a bad interval is a 422 naming it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.scheduling.time import format_instant
from tests.support.http_harness import Cast, http_world
from tests.support.stores import file_factory, memory_factory

PERIOD = 2000


@pytest.fixture(params=["memory", "file"])
def cast(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cast]:
    factory = memory_factory() if request.param == "memory" else file_factory(lambda: tmp_path)
    with http_world(factory, tmp_path) as cast:
        yield cast


def test_an_interval_schedule_fires_one_job_for_each_period(cast: Cast) -> None:
    world = cast.world
    created = world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=cast.owner[1],
        json={"name": "often", "cron": "@every 2s", "job": {"kind": "noop"}, "overlap": "allow"},
    )
    assert created.status_code == 201, created.text
    view = created.json()
    start = (world.clock.now() // PERIOD + 1) * PERIOD
    assert view["cron"] == "@every 2s"
    assert view["next_times"] == [format_instant(start + n * PERIOD) for n in range(5)]

    for _ in range(5 * 4):  # ten seconds of firing passes, four a period
        world.clock.advance(PERIOD // 4)
        world.platform.service.schedules.fire_due()

    listed = world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    times = Counter(job["schedule"]["scheduled_for"] for job in listed if job["schedule"])
    assert sorted(times) == [format_instant(start + n * PERIOD) for n in range(5)]
    assert set(times.values()) == {1}


def test_a_bad_interval_is_a_422_naming_cron(cast: Cast) -> None:
    response = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=cast.owner[1],
        json={"name": "too often", "cron": "@every 500ms", "job": {"kind": "noop"}},
    )

    assert response.status_code == 422, response.text
    assert "'@every 500ms' is no interval" in response.json()["error"]["message"]
