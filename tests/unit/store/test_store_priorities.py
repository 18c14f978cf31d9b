"""Every store grants priorities (docs/protocol.md, "Priorities"): among an endpoint's claimable
jobs a higher priority goes first, first in first out within one; owners take turns within a
priority, never across them; a priority whose jobs are not eligible yet holds nothing back; and
an older store's jobs gain the default priority on open."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.scheduling.jobs import Job, create_job, request_cancel
from moonrun.store import open_store
from moonrun.store.protocol import Store
from moonrun.store.schema import SCHEMA_VERSION
from tests.support.jobkit import ENDPOINT, POLICY, T0, claimed
from tests.support.stores import StoreFactory
from tests.unit.store.test_durable_stores import _raw_sql, private_store_url

__all__ = ["private_store_url"]  # a fixture: a file, or a database of its own


def job(name: str, priority: int | None, *, owner: str = "usr-1", at: int = 0, **more: int) -> Job:
    return create_job(
        job_id=f"job-{name}",
        server_id="srv-1",
        endpoint_id=ENDPOINT,
        owner_id=owner,
        kind="work",
        payload={},
        policy=POLICY,
        now=T0 + at,
        priority=priority,
        **more,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def claim(store: Store, limit: int, now: int = T0 + 1000, after: str | None = None) -> list[str]:
    taken = store.claim_jobs(ENDPOINT, now, limit, lambda j: claimed(j, now=now), after)
    return [j.id.removeprefix("job-") for j in taken]


def test_a_higher_priority_is_granted_first_and_fifo_within_one(store: Store) -> None:
    store.insert_jobs(
        [
            job("a5", None, at=1),
            job("b9", 9, at=2),
            job("c0", 0, at=3),
            job("d9", 9, at=4),
            job("e5", 5, at=5),
            job("f7", 7, at=6),
        ]
    )
    assert claim(store, 10) == ["b9", "d9", "f7", "a5", "e5", "c0"]


def test_one_at_a_time_the_claims_go_by_priority(store: Store) -> None:
    store.insert_jobs([job(f"{n}", n % 10, at=n) for n in range(12)])
    order = [claim(store, 1)[0] for _ in range(12)]
    assert order == ["9", "8", "7", "6", "5", "4", "3", "2", "1", "11", "0", "10"]
    assert claim(store, 1) == []


def test_owners_take_turns_within_a_priority_never_across_one(store: Store) -> None:
    store.insert_jobs(
        [
            *(job(f"alice{n}", 5, owner="usr-alice", at=n) for n in range(3)),
            *(job(f"bob{n}", 5, owner="usr-bob", at=10 + n) for n in range(3)),
            job("carol-urgent", 8, owner="usr-carol", at=20),
            job("carol-later", 8, owner="usr-carol", at=21),
        ]
    )
    assert claim(store, 6) == [
        "carol-urgent",
        "carol-later",
        "alice0",
        "bob0",
        "alice1",
        "bob1",
    ]


def test_the_turns_within_a_priority_start_after_the_owner_served_last(store: Store) -> None:
    store.insert_jobs(
        [
            job("alice", 3, owner="usr-alice", at=1),
            job("bob", 3, owner="usr-bob", at=2),
            job("carol", 3, owner="usr-carol", at=3),
            job("dave-urgent", 6, owner="usr-dave", at=4),
        ]
    )
    assert claim(store, 4, after="usr-alice") == ["dave-urgent", "bob", "carol", "alice"]


def test_a_priority_not_eligible_yet_holds_back_nothing(store: Store) -> None:
    later = T0 + 60_000
    store.insert_jobs(
        [
            job("urgent-later", 9, at=1, not_before=later),
            job("normal-now", 5, at=2),
        ]
    )
    assert claim(store, 5) == ["normal-now"]
    assert claim(store, 5, now=later) == ["urgent-later"]


def test_a_cancelled_urgent_job_leaves_the_claims(store: Store) -> None:
    urgent = job("urgent", 9, at=1)
    store.insert_jobs([urgent, job("normal", 5, at=2)])
    store.update_jobs([urgent.id], lambda j: request_cancel(j, user_id="usr-1", now=T0 + 3))
    assert claim(store, 5) == ["normal"]


def test_a_job_keeps_its_priority_in_the_store(store: Store) -> None:
    store.insert_jobs([job("p0", 0), job("p9", 9, at=1), job("default", None, at=2)])
    kept = store.get_jobs(["job-p0", "job-p9", "job-default"])
    assert {name: j.priority for name, j in kept.items()} == {
        "job-p0": 0,
        "job-p9": 9,
        "job-default": 5,
    }


def test_an_older_store_gives_every_job_the_default_priority_on_open(
    private_store_url: str,
) -> None:
    """Opening a store of schema 14 (no priorities; claims by owners alone) gives every job
    priority 5 and every waiting one its place in the claims, after jobs made since."""
    store = open_store(private_store_url)
    store.insert_jobs([job("old-1", None, at=1), job("old-2", None, at=2)])
    store.close()
    on_jobs = "" if private_store_url.startswith("file:") else " ON jobs"
    _raw_sql(
        private_store_url,
        f"DROP INDEX ix_jobs_priority_claim{on_jobs}",
        "ALTER TABLE jobs DROP COLUMN claimable_rank",
        "ALTER TABLE jobs DROP COLUMN priority",
        "CREATE INDEX ix_jobs_owner_claim ON jobs "
        "(endpoint_id, claimable_owner_id, claimable_at, created_at, id)",
        "UPDATE schema_version SET version = 14",
    )
    store = open_store(private_store_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert {j.priority for j in store.get_jobs(["job-old-1", "job-old-2"]).values()} == {5}
        store.insert_jobs([job("new-urgent", 7, at=3), job("new-low", 2, at=4)])
        assert claim(store, 10) == ["new-urgent", "old-1", "old-2", "new-low"]
    finally:
        store.close()
