"""Every store keeps dependencies (docs/protocol.md, "Dependencies"): what a job names is stored
with it and read back after a reopen; a job's (or a group's) waiters are found by its id; a job
held on its dependencies is never claimable; and the jobs still held on them are walked a few
at a time, in id order, for the sweeper."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.scheduling import dependencies as domain
from moonrun.scheduling.jobs import Job, JobState, create_job
from moonrun.store import open_store
from moonrun.store.protocol import Store
from moonrun.store.schema import SCHEMA_VERSION
from tests.support.jobkit import ENDPOINT, POLICY, T0
from tests.support.stores import StoreFactory
from tests.unit.store.test_durable_stores import _raw_sql, private_store_url

__all__ = ["private_store_url"]  # a fixture: a file, or a MySQL database of its own


def job(job_id: str, after: tuple[str, ...] = (), after_group: str | None = None) -> Job:
    return create_job(
        job_id=job_id,
        server_id="srv-1",
        endpoint_id=ENDPOINT,
        owner_id="usr-1",
        kind="noop",
        payload={},
        policy=POLICY,
        now=T0,
        after=after,
        after_group=after_group,
    )


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def test_what_a_job_waits_on_is_stored_with_it_and_read_back_after_a_reopen(
    store_factory: StoreFactory,
) -> None:
    store = store_factory.open()
    store.insert_jobs([job("job-a"), job("job-w", after=("job-a",), after_group="grp_x")])
    store = store_factory.reopen(store)
    try:
        waiting = store.get_job("job-w")
        assert waiting is not None
        assert waiting.after == ("job-a",)
        assert waiting.after_group == "grp_x"
        assert waiting.held
        assert waiting.dependency_held
        assert store.waiters(["job-a"]) == ["job-w"]
        assert store.waiters(["grp_x"]) == ["job-w"]
        assert store.waiters(["job-w", "job-nobody"]) == []
    finally:
        store.close()


def test_a_job_held_on_its_dependencies_is_never_claimable_until_released(store: Store) -> None:
    store.insert_jobs([job("job-a"), job("job-w", after=("job-a",))])
    assert [j.id for j in store.claimable_jobs(ENDPOINT, T0 + 1, 10)] == ["job-a"]
    store.update_jobs(["job-w"], lambda stored: stored.unheld(T0 + 5))
    assert [j.id for j in store.claimable_jobs(ENDPOINT, T0 + 10, 10)] == ["job-a", "job-w"]
    assert store.dependency_held_jobs(None, 10) == []


def test_every_waiter_of_several_jobs_is_found_once(store: Store) -> None:
    store.insert_jobs([job("job-a"), job("job-b")])
    store.insert_jobs(
        [job("job-w1", after=("job-a", "job-b")), job("job-w2", after=("job-b",))],
    )
    assert sorted(store.waiters(["job-a", "job-b"])) == ["job-w1", "job-w2"]


def test_jobs_held_on_dependencies_are_walked_a_few_at_a_time_in_id_order(store: Store) -> None:
    store.insert_jobs([job("job-a")])
    store.insert_jobs([job(f"job-w{n}", after=("job-a",)) for n in range(5)])
    first = store.dependency_held_jobs(None, 2)
    assert [j.id for j in first] == ["job-w0", "job-w1"]
    rest = store.dependency_held_jobs(first[-1].id, 10)
    assert [j.id for j in rest] == ["job-w2", "job-w3", "job-w4"]
    # One cancelled for its failed dependency is no longer walked.
    store.update_jobs(["job-w3"], lambda stored: domain.dependency_failed(stored, "x", T0 + 1))
    assert [j.id for j in store.dependency_held_jobs("job-w1", 10)] == ["job-w2", "job-w4"]
    ended = store.get_job("job-w3")
    assert ended is not None
    assert ended.state is JobState.CANCELLED


def test_an_older_store_gains_dependencies_on_open(private_store_url: str) -> None:
    """A store of schema 11 (no dependencies) opens at the current version, its jobs waiting
    on nothing, and keeps what new jobs wait on from then on."""
    store = open_store(private_store_url)
    store.insert_jobs([job("job-a")])
    store.close()
    on = "" if private_store_url.startswith("file:") else " ON jobs"
    _raw_sql(
        private_store_url,
        f"DROP INDEX ix_jobs_dependency_held{on}",
        "ALTER TABLE jobs DROP COLUMN dependency_held",
        "ALTER TABLE jobs DROP COLUMN after_json",
        "ALTER TABLE jobs DROP COLUMN after_group_id",
        "DROP TABLE job_dependencies",
        "UPDATE schema_version SET version = 11",
    )
    store = open_store(private_store_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION  # type: ignore[attr-defined]
        old = store.get_job("job-a")
        assert old is not None
        assert old.after == ()
        assert not old.held
        store.insert_jobs([job("job-w", after=("job-a",))])
        assert store.waiters(["job-a"]) == ["job-w"]
        assert [j.id for j in store.dependency_held_jobs(None, 10)] == ["job-w"]
    finally:
        store.close()
