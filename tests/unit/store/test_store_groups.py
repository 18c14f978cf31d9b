"""Every store keeps fan-out groups (docs/protocol.md, "Groups"): a group and its jobs in one
atomic insert, their counts and listing, held jobs that no claim takes, and releases that
take the oldest held jobs, as many as asked, once."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from moonrun.errors import AlreadyExists
from moonrun.scheduling import groups as domain
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job, JobState, create_job, request_cancel
from moonrun.store.protocol import IdempotencyRecord, Store
from tests.support.jobkit import ENDPOINT, POLICY, T0, claimed
from tests.support.stores import StoreFactory

GROUP = "grp_one"


def group(job_count: int = 5, max_parallel: int | None = 2) -> Group:
    return Group(
        id=GROUP,
        creator_id="usr-1",
        selector="role=web",
        kind="deploy.web",
        created_at=T0,
        job_count=job_count,
        max_parallel=max_parallel,
        stop_on_failure=True,
    )


def group_jobs(count: int = 5, max_parallel: int | None = 2) -> list[Job]:
    return [
        create_job(
            job_id=f"job-{n:03d}",
            server_id=f"srv-{n}",
            endpoint_id=ENDPOINT,
            owner_id="usr-1",
            kind="deploy.web",
            payload={},
            policy=POLICY,
            now=T0,
            group_id=GROUP,
            held=domain.starts_held(n, max_parallel),
        )
        for n in range(count)
    ]


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def release_all(store: Store, max_parallel: int | None = 2) -> dict[str, tuple[Job, Job]]:
    return store.release_held(
        GROUP,
        functools.partial(domain.to_release, max_parallel),
        lambda job: domain.release(job, T0 + 5),
    )


def test_a_group_and_its_jobs_are_stored_together_and_read_back_after_a_reopen(
    store_factory: StoreFactory,
) -> None:
    store = store_factory.open()
    store.insert_jobs(group_jobs(), None, group())
    store = store_factory.reopen(store)
    try:
        assert store.get_group(GROUP) == group()
        assert store.get_group("grp_missing") is None
        listed = store.list_jobs(server_ids=None, state=None, limit=10, group_id=GROUP)
        assert sorted(listed, key=lambda job: job.id) == group_jobs()
        assert store.group_counts(GROUP) == {JobState.QUEUED: 5}
    finally:
        store.close()


def test_a_group_whose_key_is_taken_stores_neither_the_group_nor_a_job(store: Store) -> None:
    record = IdempotencyRecord("usr-1", "key-1", "f" * 64, ("grp_before",), T0)
    store.insert_jobs([], record)
    with pytest.raises(AlreadyExists):
        store.insert_jobs(group_jobs(), record, group())
    assert store.get_group(GROUP) is None
    assert store.get_job("job-000") is None
    assert store.list_jobs(server_ids=None, state=None, limit=10, group_id=GROUP) == []


def test_held_jobs_are_never_claimable_and_a_release_takes_the_oldest_as_many_as_allowed(
    store: Store,
) -> None:
    store.insert_jobs(group_jobs(), None, group())
    assert store.next_claimable_at(ENDPOINT) == T0
    assert {job.id for job in store.claimable_jobs(ENDPOINT, T0 + 10, 10)} == {
        "job-000",
        "job-001",
    }
    # Two live jobs already: a group of max_parallel 2 releases none.
    assert release_all(store) == {}
    store.update_jobs(["job-000"], lambda job: request_cancel(job, user_id="usr-1", now=T0 + 1))
    released = release_all(store)
    assert list(released) == ["job-002"]
    before, after = released["job-002"]
    assert before.held
    assert not after.held
    assert after.version == before.version + 1
    assert store.get_job("job-002") == after
    assert {job.id for job in store.claimable_jobs(ENDPOINT, T0 + 10, 10)} == {
        "job-001",
        "job-002",
    }
    # Nothing more ended: releasing again changes nothing.
    assert release_all(store) == {}


def test_claims_take_only_released_jobs_of_a_group(store: Store) -> None:
    store.insert_jobs(group_jobs(), None, group())
    granted = store.claim_jobs(ENDPOINT, T0 + 10, 10, lambda job: claimed(job, now=T0 + 10))
    assert sorted(job.id for job in granted) == ["job-000", "job-001"]
    assert store.group_counts(GROUP) == {JobState.ACCEPTED: 2, JobState.QUEUED: 3}


def test_group_listing_filters_by_state_and_pages_newest_first(store: Store) -> None:
    store.insert_jobs(group_jobs(), None, group())
    store.update_jobs(["job-004"], lambda job: request_cancel(job, user_id="usr-1", now=T0 + 1))
    cancelled = store.list_jobs(server_ids=None, state=JobState.CANCELLED, limit=10, group_id=GROUP)
    assert [job.id for job in cancelled] == ["job-004"]
    first = store.list_jobs(server_ids=None, state=None, limit=2, group_id=GROUP)
    assert [job.id for job in first] == ["job-004", "job-003"]
    rest = store.list_jobs(
        server_ids=None, state=None, limit=10, group_id=GROUP, after=(T0, "job-003")
    )
    assert [job.id for job in rest] == ["job-002", "job-001", "job-000"]
    assert store.group_counts(GROUP) == {JobState.QUEUED: 4, JobState.CANCELLED: 1}


def test_the_groups_with_held_jobs_are_walked_a_few_at_a_time(store: Store) -> None:
    for name in ("grp_a", "grp_b", "grp_c"):
        jobs = [
            create_job(
                job_id=f"job-{name}-{n}",
                server_id="srv-1",
                endpoint_id=ENDPOINT,
                owner_id="usr-1",
                kind="deploy.web",
                payload={},
                policy=POLICY,
                now=T0,
                group_id=name,
                held=n > 0,
            )
            for n in range(2)
        ]
        store.insert_jobs(jobs, None, Group(name, "usr-1", "a=b", "deploy.web", T0, 2, 1))
    assert store.held_groups(None, 2) == ["grp_a", "grp_b"]
    assert store.held_groups("grp_b", 2) == ["grp_c"]
    store.update_jobs(["job-grp_b-1"], lambda job: request_cancel(job, user_id="u", now=T0))
    assert store.held_groups(None, 5) == ["grp_a", "grp_c"]


def test_releases_racing_on_many_connections_never_pass_max_parallel(
    store_factory: StoreFactory,
) -> None:
    """Eight platforms' releases at once, after the group's live jobs ended: together they
    release exactly max_parallel jobs (MySQL serialises them on the group's row)."""
    store = store_factory.open()
    # One store object, as one platform process: its threads are MySQL's pooled connections
    # (and SQLite's one writer), which is where two releases could interleave.
    others = [store] * 8
    try:
        store.insert_jobs(group_jobs(40, max_parallel=5), None, group(40, 5))
        live = [f"job-{n:03d}" for n in range(5)]
        store.update_jobs(live, lambda job: request_cancel(job, user_id="usr-1", now=T0 + 1))
        barrier = threading.Barrier(len(others))

        def release(on: Store) -> int:
            barrier.wait()
            done = on.release_held(
                GROUP,
                functools.partial(domain.to_release, 5),
                lambda job: domain.release(job, T0 + 5),
            )
            return sum(1 for before, after in done.values() if after is not before)

        with ThreadPoolExecutor(len(others)) as pool:
            released = sum(pool.map(release, others))
        assert released == 5
        counts = store.group_counts(GROUP)
        assert counts == {JobState.CANCELLED: 5, JobState.QUEUED: 35}
        claimable = store.claimable_jobs(ENDPOINT, T0 + 10, 100)
        assert len(claimable) == 5
    finally:
        store.close()
