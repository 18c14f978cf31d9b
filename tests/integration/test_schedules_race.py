"""Two platforms on one database decide the same 100 schedules at the same moments, over
several firings: every (schedule, time) has exactly one job, on PostgreSQL, MySQL and one
FileStore."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from moonrun.clock import ManualClock
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.directory import Directory
from moonrun.service.schedules import ScheduleSpec
from moonrun.service.scheduling import SchedulingService
from moonrun.service.specs import JobSpec
from moonrun.store.file import FileStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.postgres import PostgresStore
from moonrun.store.protocol import Store
from tests.conftest import build_factory
from tests.support.stores import StoreFactory

MINUTE = 60_000
SCHEDULES = 100
FIRINGS = 4
RACERS = 4
"""Firing passes at once each time: two per platform."""


@pytest.fixture(params=["file", "mysql", "postgres"])
def factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    return build_factory(request.param, request, tmp_path_factory)


def another_platforms_store(factory: StoreFactory, store: Store) -> Store:
    """A second store object, with its own connections, over the same database."""
    if isinstance(store, FileStore):
        return FileStore(store.path)
    if isinstance(store, PostgresStore):
        return PostgresStore(factory.url())
    assert isinstance(store, MySQLStore)
    return MySQLStore(factory.url())


def test_two_platforms_firing_the_same_schedules_make_one_job_per_time(
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
        admin = Directory(first, clock, SeededTokenSource(3)).ensure_bootstrap_admin(
            "mra_race-admin-token"
        )
        endpoint = platforms[0].create_endpoint(admin, "host-1").endpoint
        server = Directory(first, clock, SeededTokenSource(4)).create_server(
            admin, "web-1", endpoint_id=endpoint.id, owner_id=admin.id
        )
        made = {
            platforms[n % 2]
            .schedules.create(
                admin,
                server.id,
                ScheduleSpec(f"every minute {n}", "* * * * *", JobSpec("noop"), overlap="allow"),
            )
            .schedule.id
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
        per_time = Counter((job.schedule_id, job.scheduled_for) for job in jobs)
        assert len(jobs) == SCHEDULES * FIRINGS
        assert set(per_time.values()) == {1}
        assert {schedule_id for schedule_id, _ in per_time} == made
        fired_for = {clock.now() + 1 - n * MINUTE for n in range(1, FIRINGS + 1)}
        assert {t for _, t in per_time} == fired_for
    finally:
        first.close()
        second.close()
