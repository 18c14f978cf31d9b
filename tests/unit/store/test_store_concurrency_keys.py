"""Every store keeps concurrency keys (docs/protocol.md, "Concurrency keys"): a job with a key
is held by it and never claimable until its key releases it; a release takes the oldest held
jobs of that owner's key, as many as the key's limit allows over its live jobs, once; and
releases racing on many connections of two platforms never pass the limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from moonrun.scheduling import concurrency as domain
from moonrun.scheduling.jobs import Concurrency, Job, JobState, create_job, request_cancel
from moonrun.store import open_store
from moonrun.store.protocol import Store
from moonrun.store.schema import SCHEMA_VERSION
from tests.support.jobkit import ENDPOINT, POLICY, T0, claimed, queued_job
from tests.support.stores import StoreFactory
from tests.unit.store.test_durable_stores import _raw_sql, private_store_url

__all__ = ["private_store_url"]  # a fixture: a file, or a database of its own

KEY = "backup/db-1"
SHARED = ("mysql", "postgres")
"""The stores two platform processes may share."""


def keyed(n: int, *, owner: str = "usr-1", key: str = KEY, limit: int = 2) -> Job:
    return create_job(
        job_id=f"job-{owner}-{n:03d}",
        server_id=f"srv-{n}",
        endpoint_id=ENDPOINT,
        owner_id=owner,
        kind="backup",
        payload={},
        policy=POLICY,
        now=T0 + n,
        concurrency=Concurrency(key, limit),
    )


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def release(
    store: Store, owner: str = "usr-1", limit: int = 2, *, declare: bool = True
) -> list[str]:
    done = store.release_key(
        owner, KEY, limit, declare, domain.to_release, lambda job: domain.release(job, T0 + 50)
    )
    return sorted(job_id for job_id, (before, after) in done.items() if after is not before)


def claimable(store: Store) -> set[str]:
    return {job.id for job in store.claimable_jobs(ENDPOINT, T0 + 100, 100)}


def test_keyed_jobs_are_held_until_their_key_releases_the_oldest_up_to_its_limit(
    store: Store,
) -> None:
    store.insert_jobs([keyed(n) for n in range(5)])
    assert claimable(store) == set()
    assert store.next_claimable_at(ENDPOINT) is None
    assert release(store) == ["job-usr-1-000", "job-usr-1-001"]
    assert claimable(store) == {"job-usr-1-000", "job-usr-1-001"}
    stored = store.get_job("job-usr-1-000")
    assert stored is not None
    assert not stored.key_held
    assert stored.concurrency == Concurrency(KEY, 2)
    # Two live already: releasing again changes nothing.
    assert release(store) == []


def test_a_claimed_job_keeps_its_place_and_an_ended_one_frees_it_for_the_next_oldest(
    store: Store,
) -> None:
    store.insert_jobs([keyed(n) for n in range(4)])
    release(store)
    granted = store.claim_jobs(ENDPOINT, T0 + 100, 10, lambda job: claimed(job, now=T0 + 100))
    assert sorted(job.id for job in granted) == ["job-usr-1-000", "job-usr-1-001"]
    assert release(store) == []
    store.update_jobs(
        ["job-usr-1-001"], lambda job: request_cancel(job, user_id="usr-1", now=T0 + 101)
    )
    # A claimed job asked to cancel is still under way until it ends: nothing freed yet.
    assert release(store) == []
    store.update_jobs(
        ["job-usr-1-003"], lambda job: request_cancel(job, user_id="usr-1", now=T0 + 101)
    )
    assert release(store) == []
    ended = store.get_job("job-usr-1-003")
    assert ended is not None
    assert ended.state is JobState.CANCELLED


def test_a_key_is_its_owners_own(store: Store) -> None:
    store.insert_jobs([keyed(n, owner="usr-1") for n in range(3)])
    store.insert_jobs([keyed(n, owner="usr-2") for n in range(3)])
    assert release(store, "usr-1") == ["job-usr-1-000", "job-usr-1-001"]
    assert release(store, "usr-2") == ["job-usr-2-000", "job-usr-2-001"]


def test_the_keys_limit_is_the_last_declared_one(store: Store) -> None:
    store.insert_jobs([keyed(n) for n in range(5)])
    assert release(store, limit=1) == ["job-usr-1-000"]
    # Not declared: the key keeps its limit of 1.
    assert release(store, limit=3, declare=False) == []
    assert release(store, limit=3) == ["job-usr-1-001", "job-usr-1-002"]


def test_the_keys_with_held_jobs_are_walked_a_few_at_a_time(store: Store) -> None:
    store.insert_jobs([keyed(0, owner="usr-b"), keyed(0, owner="usr-a")])
    store.insert_jobs([keyed(0, owner="usr-c", key="a-key")])
    assert store.held_keys(None, 2) == [("usr-c", "a-key"), ("usr-a", KEY)]
    assert store.held_keys(("usr-a", KEY), 2) == [("usr-b", KEY)]
    release(store, "usr-a")
    assert store.held_keys(None, 5) == [("usr-c", "a-key"), ("usr-b", KEY)]


def test_releases_racing_on_two_platforms_never_pass_the_keys_limit(
    store_factory: StoreFactory,
) -> None:
    """Two platforms on one database, each with four connections releasing at once, over and
    over as claimed jobs end: never more than the limit of the key's jobs under way."""
    first = store_factory.open()
    # A second platform process: its own store object (its own pool) on the same database.
    second = type(first)(store_factory.url()) if store_factory.name in SHARED else first
    limit, total = 3, 30
    try:
        first.insert_jobs([keyed(n, limit=limit) for n in range(total)])
        platforms = [first, second] * 4
        barrier = threading.Barrier(len(platforms))

        def release_on(on: Store) -> int:
            barrier.wait()
            done = on.release_key(
                "usr-1",
                KEY,
                limit,
                True,
                domain.to_release,
                lambda job: domain.release(job, T0 + 50),
            )
            return sum(1 for before, after in done.values() if after is not before)

        ended = 0
        while ended < total:
            with ThreadPoolExecutor(len(platforms)) as pool:
                released = sum(pool.map(release_on, platforms))
            live = [
                job
                for job in first.list_jobs(server_ids=None, state=None, limit=total)
                if job.live_key is not None
            ]
            assert len(live) <= limit
            assert released <= limit
            if not live:
                break
            # The oldest live job ends; the next round releases one in its place.
            oldest = min(live, key=lambda job: (job.created_at, job.id))
            first.update_jobs(
                [oldest.id], lambda job: request_cancel(job, user_id="usr-1", now=T0 + 60)
            )
            ended += 1
        assert ended == total
    finally:
        first.close()
        if second is not first:
            second.close()


def test_an_older_store_gains_concurrency_keys_on_open(private_store_url: str) -> None:
    """A store of schema 13 (no keys) opens at the current version, its jobs without a key
    and as claimable as before, and keeps keyed jobs from then on."""
    store = open_store(private_store_url)
    store.insert_jobs([queued_job(job_id="job-old")])
    store.close()
    on_jobs = "" if private_store_url.startswith("file:") else " ON jobs"
    _raw_sql(
        private_store_url,
        f"DROP INDEX ix_jobs_key_held{on_jobs}",
        f"DROP INDEX ix_jobs_key_live{on_jobs}",
        *(
            f"ALTER TABLE jobs DROP COLUMN {column}"
            for column in (
                "concurrency_key",
                "concurrency_limit",
                "key_held",
                "held_key",
                "live_key",
            )
        ),
        "DROP TABLE concurrency_keys",
        "UPDATE schema_version SET version = 13",
    )
    store = open_store(private_store_url)
    try:
        old = store.get_job("job-old")
        assert old is not None
        assert old.concurrency is None
        assert not old.key_held
        assert claimable(store) == {"job-old"}
        store.insert_jobs([keyed(n) for n in range(3)])
        assert release(store) == ["job-usr-1-000", "job-usr-1-001"]
        assert store.schema_version() == SCHEMA_VERSION  # type: ignore[attr-defined]
    finally:
        store.close()
