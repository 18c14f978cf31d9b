"""The store contract for selector schedules, over every store: a schedule without a server reads
back; a firing inserts its group and the group's jobs with the schedule's change in one write,
never twice; a firing that lost the race stores nothing; a creator's selector schedules are
found; and a store of schema 15 (whose `schedules.server_id` is NOT NULL) keeps its schedules
when migrated, and then takes selector schedules."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    inspect,
    text,
)

from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.schedules import Schedule, firing_group_id, group_job_id
from moonrun.store import open_store
from moonrun.store.codec import schedule_to_row
from moonrun.store.protocol import ScheduleWrite, Store
from moonrun.store.schema import SCHEMA_VERSION, TABLE_OPTIONS
from tests.conftest import build_factory
from tests.support.stores import (
    CONTRACT_STORE_NAMES,
    StoreFactory,
    mysql_test_database,
    postgres_test_database,
)
from tests.unit.store.test_store_contract import T0, make_job
from tests.unit.store.test_store_schedules import make_schedule


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


def selector_schedule(schedule_id: str = "sch-sel", **fields: object) -> Schedule:
    fields = {"server_id": None, "selector": "role=web,env in (prod,staging)", **fields}
    return make_schedule(schedule_id, **fields)


def firing(schedule: Schedule, at: int, servers: tuple[str, ...]) -> tuple[Group, tuple[Job, ...]]:
    """The group a selector firing at `at` makes over `servers`, and its jobs."""
    group_id = firing_group_id(schedule.id, at)
    jobs = tuple(
        dataclasses.replace(
            make_job(group_job_id(schedule.id, at, server), server_id=server),
            group_id=group_id,
            schedule_id=schedule.id,
            scheduled_for=at,
        )
        for server in servers
    )
    group = Group(group_id, schedule.owner_id, schedule.selector or "", "report.build", T0, 2)
    return group, jobs


def test_a_selector_schedule_reads_back_field_for_field(store: Store) -> None:
    schedule = selector_schedule(
        max_parallel=3,
        stop_on_failure=True,
        last_scheduled_for=T0 - 5,
        last_group_id="grp-x",
        unmatched=4,
    )

    store.insert_schedule(schedule)

    assert store.get_schedule(schedule.id) == schedule
    assert store.list_schedules() == [schedule]


def test_a_selector_firing_inserts_its_group_and_jobs_with_the_schedules_change_and_never_twice(
    store: Store,
) -> None:
    schedule = selector_schedule()
    store.insert_schedule(schedule)
    at = T0 + 1000
    group, jobs = firing(schedule, at, ("srv-1", "srv-2"))
    fired = dataclasses.replace(schedule, version=2, last_group_id=group.id)

    assert store.fire_schedules([ScheduleWrite(fired, 1, group=group, group_jobs=jobs)]) == [True]
    assert store.get_group(group.id) == group
    assert store.get_jobs([job.id for job in jobs]) == {job.id: job for job in jobs}
    # The group exists: the schedule still moves, and nothing is made again.
    again = dataclasses.replace(fired, version=3)
    assert store.fire_schedules([ScheduleWrite(again, 2, group=group, group_jobs=jobs)]) == [True]
    assert len(store.list_jobs(server_ids=None, state=None, limit=10)) == 2
    assert store.job_counts().get(jobs[0].state) == 2
    assert store.get_schedule(schedule.id) == again


def test_a_selector_firing_that_lost_the_race_stores_nothing(store: Store) -> None:
    schedule = selector_schedule()
    store.insert_schedule(schedule)
    group, jobs = firing(schedule, T0 + 1000, ("srv-1", "srv-2"))

    lost = ScheduleWrite(dataclasses.replace(schedule, version=2), 7, group=group, group_jobs=jobs)
    assert store.fire_schedules([lost]) == [False]

    assert store.get_group(group.id) is None
    assert store.get_jobs([job.id for job in jobs]) == {}
    assert store.get_schedule(schedule.id) == schedule


def test_racing_selector_firings_of_one_time_make_one_group_and_one_winner(store: Store) -> None:
    schedule = selector_schedule()
    store.insert_schedule(schedule)
    group, jobs = firing(schedule, T0 + 1000, ("srv-1", "srv-2"))
    fired = dataclasses.replace(schedule, version=2, last_group_id=group.id)
    write = ScheduleWrite(fired, 1, group=group, group_jobs=jobs)

    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda _: store.fire_schedules([write]), range(8)))

    assert won.count([True]) == 1
    assert sorted(j.id for j in store.list_jobs(server_ids=None, state=None, limit=10)) == sorted(
        job.id for job in jobs
    )
    assert store.group_counts(group.id) == {jobs[0].state: 2}


def test_a_creators_selector_schedules_are_found_and_no_others(store: Store) -> None:
    store.insert_schedule(selector_schedule("sch-b", created_at=T0 + 2))
    store.insert_schedule(selector_schedule("sch-a", created_at=T0 + 1))
    store.insert_schedule(selector_schedule("sch-other", owner_id="usr-2"))
    store.insert_schedule(make_schedule("sch-server", owner_id="usr-1"))

    assert [s.id for s in store.selector_schedules("usr-1")] == ["sch-a", "sch-b"]
    assert [s.id for s in store.selector_schedules("usr-3")] == []
    # Removing a server leaves selector schedules alone.
    assert store.delete_server("srv-1") == 0
    assert {s.id for s in store.list_schedules()} == {"sch-a", "sch-b", "sch-other"}


# -- an older store ------------------------------------------------------------------------------


@pytest.fixture(params=["file", "mysql", "postgres"])
def private_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL of its own (a database apart from the session's: the test changes the
    schema)."""
    if request.param == "file":
        yield f"file:{tmp_path / 'p.db'}"
        return
    request.getfixturevalue(f"{request.param}_url")  # skips (or fails in CI) without a server
    made = mysql_test_database() if request.param == "mysql" else postgres_test_database()
    databases = cast(Generator[str, None, None], made)  # dropped at close
    yield next(databases)
    databases.close()


def _engine_url(url: str) -> str:
    if url.startswith("file:"):
        return "sqlite+pysqlite:///" + url.removeprefix("file:")
    if url.startswith("mysql://"):
        return "mysql+pymysql://" + url.removeprefix("mysql://")
    return "postgresql+psycopg://" + url.removeprefix("postgresql://")


def _schema_15_schedules() -> Table:
    """`schedules` as migration 10 made it and schema 15 still had it: `server_id` NOT NULL."""
    return Table(
        "schedules",
        MetaData(),
        Column("id", String(64), primary_key=True),
        Column("server_id", String(64), nullable=False),
        Column("owner_id", String(64), nullable=False),
        Column("name", String(64), nullable=False),
        Column("cron", String(200), nullable=False),
        Column("timezone", String(64), nullable=False),
        Column("job_json", Text, nullable=False),
        Column("overlap", String(16), nullable=False),
        Column("catchup_window_s", Integer, nullable=False),
        Column("paused", Boolean, nullable=False),
        Column("created_at", BigInteger, nullable=False),
        Column("next_at", BigInteger),
        Column("version", BigInteger, nullable=False),
        Column("last_scheduled_for", BigInteger),
        Column("last_job_id", String(64)),
        Column("skipped", BigInteger, nullable=False),
        Column("missed", BigInteger, nullable=False),
        Index("ix_schedules_due", "paused", "next_at", "id"),
        Index("ix_schedules_server", "server_id", "created_at", "id"),
        **TABLE_OPTIONS,
    )


def test_an_older_stores_schedules_survive_the_migration_and_selector_schedules_fit(
    private_url: str,
) -> None:
    """Opening a store of schema 15 with schedules in it (SQLite's table is built again: its
    NOT NULL cannot be dropped in place) keeps every schedule as it was, with no selector,
    and makes `server_id` NULL-able, with the indexes in place."""
    kept = [
        make_schedule("sch-1", last_scheduled_for=T0 - 5, last_job_id="job-x", skipped=2),
        make_schedule("sch-2", server_id="srv-2", paused=True, next_at=T0 + 5, missed=7),
    ]
    open_store(private_url).close()  # the current schema, then set back to schema 15
    engine = create_engine(_engine_url(private_url))
    old = _schema_15_schedules()
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE schedules"))
        old.create(connection)
        for schedule in kept:
            row = schedule_to_row(schedule)
            connection.execute(old.insert().values({c.name: row[c.name] for c in old.columns}))
        connection.execute(text("UPDATE schema_version SET version = 15"))
    engine.dispose()

    store = open_store(private_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION  # type: ignore[attr-defined]
        assert store.list_schedules() == kept
        assert [s.id for s in store.due_schedules(T0 + 2000, 10)] == ["sch-1"]
        assert [s.id for s in store.list_schedules("srv-2")] == ["sch-2"]
        selector = selector_schedule()
        store.insert_schedule(selector)
        assert store.selector_schedules("usr-1") == [selector]
    finally:
        store.close()
    engine = create_engine(_engine_url(private_url))
    try:
        inspector = inspect(engine)
        columns = {c["name"]: c for c in inspector.get_columns("schedules")}
        indexes = {index["name"] for index in inspector.get_indexes("schedules")}
        tables = set(inspector.get_table_names())
    finally:
        engine.dispose()
    assert columns["server_id"]["nullable"]
    assert {"ix_schedules_due", "ix_schedules_server", "ix_schedules_owner"} <= indexes
    assert "schedules_v16" not in tables
