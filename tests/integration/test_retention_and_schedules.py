"""Retention beside schedules: a schedule's running job is never pruned however old (its
overlap check still needs it), and once its finished job is pruned the schedule goes on
firing each later time once, never the pruned job's time again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from moonrun.scheduling.time import format_instant
from tests.support.harness import SETTINGS
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

MINUTE = 60_000
DAY_MS = 24 * 3600 * 1000


def to_next_minute(cast: Cast, extra_ms: int = 100) -> int:
    now = cast.world.clock.now()
    minute = (now // MINUTE + 1) * MINUTE
    cast.world.clock.advance(minute - now + extra_ms)
    return minute


def jobs_of(cast: Cast, schedule_id: str) -> list[dict[str, Any]]:
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    return [job for job in listed if (job["schedule"] or {}).get("id") == schedule_id]


def test_a_schedules_jobs_are_pruned_only_once_finished_and_no_time_fires_twice(
    tmp_path: Path,
) -> None:
    settings = replace(SETTINGS, retain_finished_s=DAY_MS / 1000)
    with http_world(memory_factory(), tmp_path, settings=settings) as cast:
        world, service = cast.world, cast.world.platform.service
        created = world.api(
            "POST",
            f"/api/v1/servers/{cast.server_id}/schedules",
            token=cast.owner[1],
            json={"name": "nightly", "cron": "* * * * *", "job": {"kind": "noop"}},
        )
        schedule_id = created.json()["id"]
        first = to_next_minute(cast)
        service.schedules.fire_due()
        (job,) = jobs_of(cast, schedule_id)
        world.clock.advance(2 * DAY_MS)

        kept = service.prune(lambda job: None)  # still queued: its overlap check needs it
        cancelled = world.api("POST", f"/api/v1/jobs/{job['id']}/cancel", token=cast.owner[1])
        world.clock.advance(DAY_MS + 1)
        pruned = service.prune(lambda job: None)
        view = world.api("GET", f"/api/v1/schedules/{schedule_id}", token=cast.owner[1]).json()
        later = to_next_minute(cast)
        service.schedules.fire_due()
        service.schedules.fire_due()
        fired = jobs_of(cast, schedule_id)

    assert (kept, cancelled.status_code) == ([], 200)
    assert [gone.id for gone in pruned] == [job["id"]]
    assert view["last_firing"]["job_state"] is None  # the view says the job is gone
    assert [j["schedule"]["scheduled_for"] for j in fired] == [format_instant(later)]
    assert format_instant(first) != format_instant(later)
