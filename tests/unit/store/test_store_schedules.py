"""The store contract for schedules, over every store: kept, found when due, changed only by
compare-and-swap, and a firing's job inserted at most once with its schedule's change."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from moonrun.errors import AlreadyExists
from moonrun.scheduling.records import Server
from moonrun.scheduling.schedules import Overlap, Schedule, firing_job_id
from moonrun.store.protocol import ScheduleWrite, Store
from tests.conftest import build_factory
from tests.support.stores import CONTRACT_STORE_NAMES, StoreFactory
from tests.unit.store.test_store_contract import T0, make_job


@pytest.fixture(params=CONTRACT_STORE_NAMES)
def store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    store = store_factory.open()
    yield store
    store.close()


def make_schedule(schedule_id: str = "sch-1", **fields: object) -> Schedule:
    base = Schedule(
        id=schedule_id,
        server_id="srv-1",
        owner_id="usr-1",
        name="nightly backup",
        cron="0 3 * * *",
        timezone="Europe/Berlin",
        job_json='{"kind":"noop"}',
        overlap=Overlap.CANCEL_PREVIOUS,
        catchup_window_s=60,
        paused=False,
        created_at=T0,
        next_at=T0 + 1000,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def fired_job(schedule: Schedule, scheduled_for: int):  # type: ignore[no-untyped-def]
    job = make_job(firing_job_id(schedule.id, scheduled_for))
    return dataclasses.replace(job, schedule_id=schedule.id, scheduled_for=scheduled_for)


def test_a_schedule_reads_back_field_for_field(store: Store) -> None:
    schedule = make_schedule(last_scheduled_for=T0 - 5, last_job_id="job-x", skipped=2, missed=3)

    store.insert_schedule(schedule)

    assert store.get_schedule(schedule.id) == schedule
    assert store.get_schedule("sch-none") is None
    with pytest.raises(AlreadyExists):
        store.insert_schedule(schedule)


def test_due_schedules_are_the_unpaused_ones_whose_cursor_passed_earliest_first(
    store: Store,
) -> None:
    store.insert_schedule(make_schedule("sch-late", next_at=T0 + 30))
    store.insert_schedule(make_schedule("sch-early", next_at=T0 + 10))
    store.insert_schedule(make_schedule("sch-paused", next_at=T0, paused=True))
    store.insert_schedule(make_schedule("sch-future", next_at=T0 + 1_000))
    store.insert_schedule(make_schedule("sch-done", next_at=None))

    due = store.due_schedules(T0 + 100, limit=10)

    assert [s.id for s in due] == ["sch-early", "sch-late"]
    assert [s.id for s in store.due_schedules(T0 + 100, limit=1)] == ["sch-early"]


def test_a_schedule_changes_only_from_the_version_it_was_read_at(store: Store) -> None:
    schedule = make_schedule()
    store.insert_schedule(schedule)
    moved = dataclasses.replace(schedule, next_at=T0 + 2000, version=2)

    assert store.fire_schedules([ScheduleWrite(moved, 1)]) == [True]
    assert store.fire_schedules([ScheduleWrite(dataclasses.replace(moved, version=3), 1)]) == [
        False
    ]
    assert store.get_schedule(schedule.id) == moved


def test_a_firing_inserts_its_job_with_the_schedules_change_and_never_twice(store: Store) -> None:
    schedule = make_schedule()
    store.insert_schedule(schedule)
    job = fired_job(schedule, T0 + 1000)
    fired = dataclasses.replace(schedule, version=2, last_job_id=job.id)

    assert store.fire_schedules([ScheduleWrite(fired, 1, job)]) == [True]
    assert store.get_job(job.id) == job
    again = dataclasses.replace(fired, version=3)
    # The job exists: the schedule still moves.
    assert store.fire_schedules([ScheduleWrite(again, 2, job)]) == [True]
    assert store.list_jobs(server_ids=None, state=None, limit=10) == [job]


def test_a_firing_that_lost_the_race_stores_nothing(store: Store) -> None:
    schedule = make_schedule()
    store.insert_schedule(schedule)
    job = fired_job(schedule, T0 + 1000)

    lost = ScheduleWrite(dataclasses.replace(schedule, version=2), 7, job)
    assert store.fire_schedules([lost]) == [False]

    assert store.get_job(job.id) is None
    assert store.get_schedule(schedule.id) == schedule


def test_racing_firings_of_one_time_make_one_job_and_one_winner(store: Store) -> None:
    schedule = make_schedule()
    store.insert_schedule(schedule)
    job = fired_job(schedule, T0 + 1000)
    fired = dataclasses.replace(schedule, version=2, last_job_id=job.id)

    with ThreadPoolExecutor(8) as pool:
        won = list(
            pool.map(lambda _: store.fire_schedules([ScheduleWrite(fired, 1, job)]), range(8))
        )

    assert won.count([True]) == 1
    assert store.list_jobs(server_ids=None, state=None, limit=10) == [job]


def test_schedules_list_by_server_and_go_with_their_server(store: Store) -> None:
    store.insert_server(Server("srv-1", "web-1", "ep-1", "usr-1", T0))
    store.insert_server(Server("srv-2", "web-2", "ep-1", "usr-1", T0))
    store.insert_schedule(make_schedule("sch-a", created_at=T0 + 1))
    store.insert_schedule(make_schedule("sch-b", created_at=T0 + 2))
    store.insert_schedule(make_schedule("sch-c", server_id="srv-2"))

    assert [s.id for s in store.list_schedules("srv-1")] == ["sch-a", "sch-b"]
    assert [s.id for s in store.list_schedules()] == ["sch-c", "sch-a", "sch-b"]
    assert store.delete_server("srv-1") == 0
    assert [s.id for s in store.list_schedules()] == ["sch-c"]
    assert store.delete_schedule("sch-c")
    assert not store.delete_schedule("sch-c")
    assert store.list_schedules() == []


def test_one_write_fires_many_schedules_and_a_conflict_stores_nothing_of_its_own(
    store: Store,
) -> None:
    a, b = make_schedule("sch-a"), make_schedule("sch-b")
    store.insert_schedule(a)
    store.insert_schedule(b)
    job_a, job_b = fired_job(a, T0 + 1000), fired_job(b, T0 + 1000)

    stored = store.fire_schedules(
        [
            ScheduleWrite(dataclasses.replace(a, version=2, last_job_id=job_a.id), 1, job_a),
            ScheduleWrite(dataclasses.replace(b, version=9), 5, job_b),  # read at another version
        ]
    )

    assert stored == [True, False]
    assert store.get_job(job_a.id) == job_a
    assert store.get_job(job_b.id) is None
    assert store.get_schedule("sch-b") == b
    assert store.job_counts().get(job_a.state) == 1
