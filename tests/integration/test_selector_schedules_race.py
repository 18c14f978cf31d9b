"""Two platforms on one database decide the same selector schedules at the same moments, over
several firings: every (schedule, time) has exactly one group, with exactly one job on each
matching server, on PostgreSQL, MySQL and one FileStore."""

from __future__ import annotations

import threading
from collections import Counter

from moonrun.clock import ManualClock
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.directory import Directory
from moonrun.service.schedules import ScheduleSpec
from moonrun.service.scheduling import SchedulingService
from moonrun.service.specs import JobSpec
from tests.integration.test_schedules_race import another_platforms_store, factory
from tests.support.stores import StoreFactory

__all__ = ["factory"]  # a fixture: file, mysql, postgres

MINUTE = 60_000
SCHEDULES = 20
SERVERS = 3
FIRINGS = 3
RACERS = 4
"""Firing passes at once each time: two per platform."""


def test_two_platforms_firing_the_same_selector_schedules_make_one_group_per_time(
    factory: StoreFactory,
) -> None:
    clock = ManualClock((1_795_000_000_000 // MINUTE + 1) * MINUTE - 1)
    first = factory.open()
    second = another_platforms_store(factory, first)
    try:
        platforms = [
            SchedulingService(store, clock, SeededTokenSource(seed))
            for seed, store in ((1, first), (2, second))
        ]
        directory = Directory(first, clock, SeededTokenSource(3))
        admin = directory.ensure_bootstrap_admin("mra_race-admin-token")
        endpoint = platforms[0].create_endpoint(admin, "host-1").endpoint
        servers = {
            directory.create_server(
                admin,
                f"web-{n}",
                endpoint_id=endpoint.id,
                owner_id=admin.id,
                labels={"role": "web"},
            ).id
            for n in range(SERVERS)
        }
        spec = ScheduleSpec(
            "fleet", "* * * * *", JobSpec("noop"), overlap="allow", selector="role=web"
        )
        made = {
            platforms[n % 2].schedules.create(admin, None, spec).schedule.id
            for n in range(SCHEDULES)
        }

        for _ in range(FIRINGS):
            clock.advance(MINUTE)
            together = threading.Barrier(RACERS)

            def fire(platform: SchedulingService, together: threading.Barrier = together) -> None:
                together.wait()
                platform.schedules.fire_due(limit=SCHEDULES)

            racers = [
                threading.Thread(target=fire, args=(platforms[n % 2],)) for n in range(RACERS)
            ]
            for racer in racers:
                racer.start()
            for racer in racers:
                racer.join()

        jobs = first.list_jobs(server_ids=None, state=None, limit=10**6)
        per_server = Counter((job.schedule_id, job.scheduled_for, job.server_id) for job in jobs)
        assert len(jobs) == SCHEDULES * FIRINGS * SERVERS
        assert set(per_server.values()) == {1}
        groups = {(job.schedule_id, job.scheduled_for): set[str | None]() for job in jobs}
        for job in jobs:
            groups[job.schedule_id, job.scheduled_for].add(job.group_id)
        assert {len(ids) for ids in groups.values()} == {1}
        assert {schedule_id for schedule_id, _ in groups} == made
        assert {server for _, _, server in per_server} == servers
        for (_, _), (group_id,) in groups.items():
            assert group_id is not None
            assert first.group_counts(group_id) == {jobs[0].state: SERVERS}
    finally:
        first.close()
        second.close()
